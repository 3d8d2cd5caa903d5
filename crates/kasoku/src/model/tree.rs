//! Token trees: the batch a speculative step feeds the model. Every drafter builds one, the
//! verifier runs it in one forward pass, and the commit keeps one root-to-node path of it.
//!
//! Nodes are stored in depth-first pre-order (each node before its subtree, children in the
//! order they were added, most likely first by convention), with for each node its parent,
//! its depth (the root has depth 0) and the end of its subtree interval: node `j` is an
//! ancestor-or-self of node `i` exactly when `j ≤ i < end(j)`. A chain is a tree whose every
//! node has one child. The root is the one token not yet in the model's state (the last
//! sampled token); node `i` sits at position `state.len() + depth(i)`.

/// The parent of a root in [`TokenTree::parents`].
pub const NO_PARENT: usize = usize::MAX;

/// A token tree in depth-first order. Build one with [`TreeBuilder`] or [`TokenTree::chain`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenTree {
    tokens: Vec<u32>,
    parents: Vec<usize>,
    depths: Vec<usize>,
    ends: Vec<usize>,
}

impl TokenTree {
    /// The chain `tokens[0] → tokens[1] → …` (empty for no tokens).
    pub fn chain(tokens: &[u32]) -> TokenTree {
        let n = tokens.len();
        TokenTree {
            tokens: tokens.to_vec(),
            parents: (0..n)
                .map(|i| if i == 0 { NO_PARENT } else { i - 1 })
                .collect(),
            depths: (0..n).collect(),
            ends: vec![n; n],
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn token(&self, i: usize) -> u32 {
        self.tokens[i]
    }

    /// Parent of every node ([`NO_PARENT`] for the root).
    pub fn parents(&self) -> &[usize] {
        &self.parents
    }

    pub fn parent(&self, i: usize) -> Option<usize> {
        Some(self.parents[i]).filter(|&p| p != NO_PARENT)
    }

    pub fn depth(&self, i: usize) -> usize {
        self.depths[i]
    }

    pub fn depths(&self) -> &[usize] {
        &self.depths
    }

    /// One past the last node of `i`'s subtree.
    pub fn end(&self, i: usize) -> usize {
        self.ends[i]
    }

    /// Whether `j` is `i` or one of its ancestors.
    pub fn is_ancestor_or_self(&self, j: usize, i: usize) -> bool {
        j <= i && i < self.ends[j]
    }

    /// The deepest node's depth (0 for a lone root).
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// The children of `i`, in order.
    pub fn children(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let mut c = i + 1;
        std::iter::from_fn(move || {
            if c >= self.ends[i] {
                return None;
            }
            let child = c;
            c = self.ends[c];
            Some(child)
        })
    }

    /// The child of `i` carrying `token`, if any.
    pub fn child_with(&self, i: usize, token: u32) -> Option<usize> {
        self.children(i).find(|&c| self.tokens[c] == token)
    }

    /// The nodes from the root down to `i`, `i` last.
    pub fn path(&self, i: usize) -> Vec<usize> {
        let mut p = vec![i];
        let mut n = i;
        while let Some(up) = self.parent(n) {
            p.push(up);
            n = up;
        }
        p.reverse();
        p
    }

    /// Whether `nodes` is a path from the root downwards (each node a child of the one before).
    pub fn is_root_path(&self, nodes: &[usize]) -> bool {
        nodes.first() == Some(&0)
            && nodes.iter().all(|&n| n < self.len())
            && nodes.windows(2).all(|w| self.parent(w[1]) == Some(w[0]))
    }
}

/// Builds a [`TokenTree`] from nodes added in any order (a parent before its children).
/// Adding a token that its parent already has returns the existing node, so trees from
/// several drafters merge into one.
#[derive(Clone, Debug, Default)]
pub struct TreeBuilder {
    tokens: Vec<u32>,
    parents: Vec<usize>,
    children: Vec<Vec<usize>>,
}

impl TreeBuilder {
    /// A tree of one root node.
    pub fn new(root: u32) -> TreeBuilder {
        TreeBuilder {
            tokens: vec![root],
            parents: vec![NO_PARENT],
            children: vec![Vec::new()],
        }
    }

    /// Nodes so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn token(&self, node: usize) -> u32 {
        self.tokens[node]
    }

    /// Tokens in the order they were added (ids are indices).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Parents in the order nodes were added ([`NO_PARENT`] for the root); a parent's id is
    /// always smaller than its child's.
    pub fn parents(&self) -> &[usize] {
        &self.parents
    }

    /// The depth of a node added so far.
    pub fn depth(&self, mut node: usize) -> usize {
        let mut d = 0;
        while self.parents[node] != NO_PARENT {
            node = self.parents[node];
            d += 1;
        }
        d
    }

    /// Adds `token` under `parent` (an id this builder returned) and returns its id; an
    /// existing child with that token is returned instead of a duplicate.
    pub fn add(&mut self, parent: usize, token: u32) -> usize {
        assert!(parent < self.tokens.len(), "tree builder: unknown parent");
        if let Some(&c) = self.children[parent]
            .iter()
            .find(|&&c| self.tokens[c] == token)
        {
            return c;
        }
        let id = self.tokens.len();
        self.tokens.push(token);
        self.parents.push(parent);
        self.children.push(Vec::new());
        self.children[parent].push(id);
        id
    }

    /// Adds the chain `tokens` below `parent`; returns the last node's id.
    pub fn add_chain(&mut self, parent: usize, tokens: &[u32]) -> usize {
        tokens.iter().fold(parent, |p, &t| self.add(p, t))
    }

    /// Adds every node of `tree` (whose root carries this builder's root token) under the
    /// root, merging shared prefixes.
    pub fn merge(&mut self, tree: &TokenTree) {
        let mut ids = vec![0usize; tree.len()];
        for i in 1..tree.len() {
            let p = tree.parent(i).expect("a non-root node has a parent");
            ids[i] = self.add(ids[p], tree.token(i));
        }
    }

    /// The tree in depth-first order, and for each builder id its node index in it.
    pub fn build(&self) -> (TokenTree, Vec<usize>) {
        let n = self.tokens.len();
        let mut tree = TokenTree {
            tokens: Vec::with_capacity(n),
            parents: Vec::with_capacity(n),
            depths: Vec::with_capacity(n),
            ends: vec![0; n],
        };
        let mut index = vec![0usize; n];
        // (builder id, parent's tree index, depth, whether we are leaving it).
        let mut stack = vec![(0usize, NO_PARENT, 0usize, false)];
        while let Some((id, parent, depth, leaving)) = stack.pop() {
            if leaving {
                tree.ends[index[id]] = tree.tokens.len();
                continue;
            }
            let at = tree.tokens.len();
            index[id] = at;
            tree.tokens.push(self.tokens[id]);
            tree.parents.push(parent);
            tree.depths.push(depth);
            stack.push((id, parent, depth, true));
            for &c in self.children[id].iter().rev() {
                stack.push((c, at, depth + 1, false));
            }
        }
        (tree, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root 10 → {11 → {13, 14}, 12 → 15}, children added out of depth-first order.
    fn sample() -> (TokenTree, Vec<usize>) {
        let mut b = TreeBuilder::new(10);
        let a = b.add(0, 11);
        let c = b.add(0, 12);
        b.add(a, 13);
        b.add(c, 15);
        b.add(a, 14);
        b.build()
    }

    #[test]
    fn builds_depth_first_with_intervals() {
        let (t, index) = sample();
        assert_eq!(t.tokens(), &[10, 11, 13, 14, 12, 15]);
        assert_eq!(t.parents(), &[NO_PARENT, 0, 1, 1, 0, 4]);
        assert_eq!(t.depths(), &[0, 1, 2, 2, 1, 2]);
        assert_eq!(index, vec![0, 1, 4, 2, 5, 3]);
        assert_eq!(t.end(0), 6);
        assert_eq!(t.end(1), 4);
        assert_eq!(t.end(4), 6);
        // The interval test agrees with walking parents.
        for i in 0..t.len() {
            for j in 0..t.len() {
                assert_eq!(t.is_ancestor_or_self(j, i), t.path(i).contains(&j));
            }
        }
        assert_eq!(t.children(0).collect::<Vec<_>>(), vec![1, 4]);
        assert_eq!(t.child_with(1, 14), Some(3));
        assert_eq!(t.child_with(1, 15), None);
        assert_eq!(t.path(5), vec![0, 4, 5]);
        assert!(t.is_root_path(&[0, 1, 3]));
        assert!(!t.is_root_path(&[0, 3]));
        assert_eq!(t.max_depth(), 2);
    }

    #[test]
    fn a_chain_is_a_tree() {
        let c = TokenTree::chain(&[5, 6, 7]);
        let mut b = TreeBuilder::new(5);
        b.add_chain(0, &[6, 7]);
        assert_eq!(b.build().0, c);
        assert_eq!(c.path(2), vec![0, 1, 2]);
        assert!(TokenTree::chain(&[]).is_empty());
    }

    #[test]
    fn merging_shares_common_prefixes() {
        let mut b = TreeBuilder::new(1);
        b.add_chain(0, &[2, 3, 4]);
        b.merge(&TokenTree::chain(&[1, 2, 3, 9]));
        b.merge(&TokenTree::chain(&[1, 7]));
        let (t, _) = b.build();
        assert_eq!(t.tokens(), &[1, 2, 3, 4, 9, 7]);
        assert_eq!(t.parents(), &[NO_PARENT, 0, 1, 2, 2, 0]);
    }
}
