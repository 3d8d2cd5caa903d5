//! Several drafters in one tree: the primary drafter's tree, with the branches of the others
//! merged into it (shared prefixes once), each extra drafter limited to a few nodes. Prompt
//! lookup beside a draft model costs nothing to draft and catches the long copied spans a
//! small model guesses token by token.

use super::drafter::{Accepted, DraftError, DraftRequest, Drafter, Features};
use crate::model::{TokenTree, TreeBuilder};

/// A primary drafter plus extra ones.
pub struct MergedDrafter {
    primary: Box<dyn Drafter>,
    extras: Vec<(Box<dyn Drafter>, usize)>,
}

impl MergedDrafter {
    /// `extras`: each drafter with the most nodes it may add.
    pub fn new(primary: Box<dyn Drafter>, extras: Vec<(Box<dyn Drafter>, usize)>) -> Self {
        MergedDrafter { primary, extras }
    }
}

impl Drafter for MergedDrafter {
    fn name(&self) -> &'static str {
        self.primary.name()
    }

    fn wants_hidden(&self) -> bool {
        self.primary.wants_hidden() || self.extras.iter().any(|(d, _)| d.wants_hidden())
    }

    fn tap_layers(&self) -> Vec<usize> {
        // One set of layer outputs reaches every drafter: the union, in this order.
        let mut taps = self.primary.tap_layers();
        for (d, _) in &self.extras {
            for l in d.tap_layers() {
                if !taps.contains(&l) {
                    taps.push(l);
                }
            }
        }
        taps
    }

    fn start(&mut self, prompt: &[u32], features: Features) -> Result<(), DraftError> {
        self.primary.start(prompt, features)?;
        for (d, _) in &mut self.extras {
            d.start(prompt, features)?;
        }
        Ok(())
    }

    fn catch_up(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        self.primary.catch_up(tokens)?;
        for (d, _) in &mut self.extras {
            d.catch_up(tokens)?;
        }
        Ok(())
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        let main = self.primary.draft(req)?;
        if main.is_empty() {
            return Ok(main);
        }
        let mut tree = TreeBuilder::new(main.token(0));
        tree.merge(&main);
        for (d, most) in &mut self.extras {
            let room = (req.budget + 1).saturating_sub(tree.len()).min(*most);
            if room == 0 {
                continue;
            }
            let extra = d.draft(&DraftRequest {
                budget: room,
                ..*req
            })?;
            if extra.is_empty() || extra.token(0) != main.token(0) {
                continue;
            }
            // Add the extra tree's nodes while they fit (shared prefixes are free).
            let mut ids = vec![0usize; extra.len()];
            for i in 1..extra.len() {
                let p = extra.parent(i).expect("below the root");
                if tree.len() > req.budget {
                    break;
                }
                ids[i] = tree.add(ids[p], extra.token(i));
            }
        }
        Ok(tree.build().0)
    }

    fn accept(&mut self, accepted: &Accepted) -> Result<(), DraftError> {
        self.primary.accept(accepted)?;
        for (d, _) in &mut self.extras {
            d.accept(accepted)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::NgramDrafter;

    /// A drafter that always proposes a fixed chain.
    struct Fixed(Vec<u32>);

    impl Drafter for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn start(&mut self, _: &[u32], _: Features) -> Result<(), DraftError> {
            Ok(())
        }
        fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
            let mut chain = vec![*req.tokens.last().unwrap()];
            chain.extend(self.0.iter().take(req.budget));
            Ok(TokenTree::chain(&chain))
        }
        fn accept(&mut self, _: &Accepted) -> Result<(), DraftError> {
            Ok(())
        }
    }

    #[test]
    fn extra_branches_join_the_primary_tree_within_the_budget() {
        let mut d = MergedDrafter::new(
            Box::new(Fixed(vec![7, 8])),
            vec![(Box::new(NgramDrafter::default()), 2)],
        );
        // The n-gram drafter would propose 4 5 6 after "… 2 3".
        let tokens = [1, 2, 3, 4, 5, 6, 0, 2, 3];
        let req = DraftRequest {
            tokens: &tokens,
            budget: 4,
            max_depth: 4,
        };
        let t = d.draft(&req).unwrap();
        assert_eq!(t.tokens(), &[3, 7, 8, 4, 5]);
        assert_eq!(t.len(), 5);
        // With a budget the primary fills, nothing is added.
        let t = d.draft(&DraftRequest { budget: 2, ..req }).unwrap();
        assert_eq!(t.tokens(), &[3, 7, 8]);
    }
}
