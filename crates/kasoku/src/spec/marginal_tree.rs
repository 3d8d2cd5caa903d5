//! Trees from per-position marginals (DDTree-style; research/speculative.md §2.5). A block
//! drafter gives, for each depth `d` below the root, a distribution over the token at that
//! depth, independent of the tokens above it. Scoring a path by the product of its tokens'
//! marginal probabilities, the `budget` best prefix-closed paths are enumerated best first
//! from the per-depth top-k lists with a heap that holds at most `budget + 1` entries: a
//! popped node pushes its next sibling (the next-ranked token at its depth, same parent) and
//! its first child (the best token one level deeper). Since every edge's log-probability is
//! ≤ 0, a node is never popped before its parent, so the result is a valid tree.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::model::{TokenTree, TreeBuilder};

/// The `k` most likely tokens of each row of `logits` (`rows × width`, token ids are column
/// indices) with their log-probabilities under the row's softmax, most likely first.
pub fn top_k_log_probs(logits: &[f32], width: usize, k: usize) -> Vec<Vec<(u32, f32)>> {
    if width == 0 {
        return Vec::new();
    }
    logits
        .chunks_exact(width)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if !max.is_finite() {
                return Vec::new();
            }
            let lse = max + row.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
            let mut idx: Vec<u32> = (0..row.len() as u32).collect();
            let k = k.min(row.len());
            let by_logit =
                |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
            if k < idx.len() && k > 0 {
                idx.select_nth_unstable_by(k - 1, by_logit);
            }
            idx.truncate(k);
            idx.sort_by(by_logit);
            idx.into_iter()
                .map(|t| (t, row[t as usize] - lse))
                .collect()
        })
        .collect()
}

/// A heap entry: the node that would come next, ordered by score (higher first), then by
/// shallower depth, then by lower rank and earlier parent (deterministic ties).
#[derive(Clone, Copy, Debug)]
struct Candidate {
    score: f64,
    depth: usize,
    rank: usize,
    parent: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.depth.cmp(&self.depth))
            .then(other.rank.cmp(&self.rank))
            .then(other.parent.cmp(&self.parent))
    }
}

/// Adds to `tree` (below its node `root`) the `budget` best paths under the product of the
/// marginals `cands` (depth `d + 1` choosing among `cands[d]`, each list most likely first,
/// with log-probabilities), at most `max_depth` levels below `root`. Nodes already in the
/// tree are shared (they cost no budget). Returns the number of nodes added.
pub fn add_best_paths(
    tree: &mut TreeBuilder,
    root: usize,
    cands: &[Vec<(u32, f32)>],
    budget: usize,
    max_depth: usize,
) -> usize {
    let depth_limit = max_depth.min(cands.len());
    let mut heap = BinaryHeap::new();
    let first = |d: usize| cands.get(d).and_then(|c| c.first()).map(|&(_, l)| l as f64);
    if let (true, Some(l)) = (depth_limit > 0, first(0)) {
        heap.push(Candidate {
            score: l,
            depth: 1,
            rank: 0,
            parent: root,
        });
    }
    let start = tree.len();
    // Pops are bounded too: shared nodes cost nothing, so a tree full of them must still end.
    let mut pops = 0;
    while tree.len() - start < budget && pops < budget.saturating_mul(4) + 16 {
        let Some(c) = heap.pop() else { break };
        pops += 1;
        let row = &cands[c.depth - 1];
        let (token, logp) = row[c.rank];
        let node = tree.add(c.parent, token);
        if let Some(&(_, next)) = row.get(c.rank + 1) {
            heap.push(Candidate {
                score: c.score - logp as f64 + next as f64,
                rank: c.rank + 1,
                ..c
            });
        }
        if c.depth < depth_limit {
            if let Some(l) = first(c.depth) {
                heap.push(Candidate {
                    score: c.score + l,
                    depth: c.depth + 1,
                    rank: 0,
                    parent: node,
                });
            }
        }
    }
    tree.len() - start
}

/// The tree rooted at `root` of the `budget` best paths (see [`add_best_paths`]).
pub fn best_paths_tree(
    root: u32,
    cands: &[Vec<(u32, f32)>],
    budget: usize,
    max_depth: usize,
) -> TokenTree {
    let mut tree = TreeBuilder::new(root);
    add_best_paths(&mut tree, 0, cands, budget, max_depth);
    tree.build().0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every root path of `t` with its product of marginals.
    fn path_scores(t: &TokenTree, cands: &[Vec<(u32, f32)>]) -> Vec<f64> {
        (1..t.len())
            .map(|i| {
                t.path(i)[1..]
                    .iter()
                    .map(|&n| {
                        let d = t.depth(n) - 1;
                        let tok = t.token(n);
                        cands[d].iter().find(|c| c.0 == tok).unwrap().1 as f64
                    })
                    .sum()
            })
            .collect()
    }

    /// All prefix-closed paths of length ≤ depth, by brute force: their scores, best first.
    fn all_scores(cands: &[Vec<(u32, f32)>], depth: usize) -> Vec<f64> {
        let mut out = Vec::new();
        let mut stack = vec![(0usize, 0f64)];
        while let Some((d, s)) = stack.pop() {
            if d == depth {
                continue;
            }
            for &(_, l) in &cands[d] {
                out.push(s + l as f64);
                stack.push((d + 1, s + l as f64));
            }
        }
        out.sort_by(|a, b| b.total_cmp(a));
        out
    }

    fn cands() -> Vec<Vec<(u32, f32)>> {
        let logits = [
            [3.0f32, 1.0, 0.5, -1.0, 0.0, 2.5],
            [0.0, 4.0, 0.0, 0.0, 3.9, 0.0],
            [1.0, 1.0, 1.2, 0.0, 0.0, -2.0],
            [9.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ];
        let flat: Vec<f32> = logits.iter().flatten().copied().collect();
        top_k_log_probs(&flat, 6, 3)
    }

    #[test]
    fn top_k_is_sorted_and_normalised_over_the_whole_row() {
        let c = cands();
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 5, 1]);
        let z: f32 = [3.0f32, 1.0, 0.5, -1.0, 0.0, 2.5]
            .iter()
            .map(|l| l.exp())
            .sum();
        assert!((c[0][0].1 - (3.0f32.exp() / z).ln()).abs() < 1e-6);
        // Ties go to the lower token id.
        assert_eq!(c[2].iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 0, 1]);
        assert!(top_k_log_probs(&[], 6, 3).is_empty());
    }

    /// The tree holds exactly the `budget` best-scoring prefix-closed paths.
    #[test]
    fn the_tree_is_the_best_paths_by_product_of_marginals() {
        let c = cands();
        for budget in [1, 2, 5, 9, 20] {
            for depth in [1, 2, 4] {
                let t = best_paths_tree(7, &c, budget, depth);
                let want = all_scores(&c, depth);
                let n = budget.min(want.len());
                assert_eq!(t.len(), n + 1, "budget {budget} depth {depth}");
                assert!(t.max_depth() <= depth);
                let mut got = path_scores(&t, &c);
                got.sort_by(|a, b| b.total_cmp(a));
                for (g, w) in got.iter().zip(&want[..n]) {
                    assert!((g - w).abs() < 1e-9, "budget {budget} depth {depth}");
                }
            }
        }
        // A confident block gives a chain.
        let chain = best_paths_tree(7, &[vec![(1, -0.01)], vec![(2, -0.01)]], 5, 5);
        assert_eq!(chain, TokenTree::chain(&[7, 1, 2]));
        assert_eq!(best_paths_tree(7, &[], 5, 5).len(), 1);
        assert_eq!(best_paths_tree(7, &c, 0, 5).len(), 1);
    }

    /// Nodes already in the tree (another drafter's branch) are shared, not paid for.
    #[test]
    fn existing_nodes_are_shared() {
        let c = cands();
        let mut tree = TreeBuilder::new(7);
        tree.add(0, 0); // the best first token, already there
        let added = add_best_paths(&mut tree, 0, &c, 3, 4);
        assert_eq!(added, 3);
        assert_eq!(tree.len(), 5);
    }
}
