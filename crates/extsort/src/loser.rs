//! A tree of losers: the k-way merge of sorted inputs with ⌈log2 k⌉
//! comparisons per output element (Knuth, TAOCP 5.4.1).
//!
//! ```text
//!                 winner
//!                   │
//!              [loser 1]             each inner node keeps the loser of
//!             /         \            the match played there; after the
//!        [loser 2]    [loser 3]      winner advances, one path from its
//!         /    \       /    \        leaf to the root is replayed
//!       in0   in1    in2    in3
//! ```
//!
//! Inputs are [`MergeCursor`]s. A finished input loses to everything, and
//! ties go to the lower input index, so merging runs in their order keeps
//! equal keys in input order (the merge is stable).

/// One sorted input of a merge.
pub trait MergeCursor {
    /// No element left.
    fn is_done(&self) -> bool;
    /// Whether this input's current element sorts before `other`'s
    /// (both not done).
    fn less_than(&self, other: &Self) -> bool;
}

/// The merge state over `k` cursors.
pub struct LoserTree<C> {
    cursors: Vec<C>,
    /// `tree[0]` is the winner; `tree[1..k]` the losers of inner nodes.
    tree: Vec<usize>,
}

impl<C: MergeCursor> LoserTree<C> {
    /// Plays the initial tournament.
    pub fn new(cursors: Vec<C>) -> Self {
        let k = cursors.len();
        let mut this = Self {
            cursors,
            tree: vec![usize::MAX; k.max(1)],
        };
        if k > 0 {
            let winner = this.build(1);
            this.tree[0] = winner;
        }
        this
    }

    /// Fills the subtree at inner node `node` (leaves are `k..2k`); returns
    /// its winner.
    fn build(&mut self, node: usize) -> usize {
        let k = self.cursors.len();
        if node >= k {
            return node - k;
        }
        let left = self.build(2 * node);
        let right = self.build(2 * node + 1);
        let (winner, loser) = if self.beats(right, left) {
            (right, left)
        } else {
            (left, right)
        };
        self.tree[node] = loser;
        winner
    }

    /// Whether input `a` wins against input `b`.
    #[inline]
    fn beats(&self, a: usize, b: usize) -> bool {
        let (ca, cb) = (&self.cursors[a], &self.cursors[b]);
        match (ca.is_done(), cb.is_done()) {
            (true, _) => false,
            (false, true) => true,
            (false, false) => ca.less_than(cb) || (!cb.less_than(ca) && a < b),
        }
    }

    /// The input holding the smallest current element, if any is left.
    pub fn winner(&self) -> Option<usize> {
        let w = *self.tree.first()?;
        (w != usize::MAX && !self.cursors[w].is_done()).then_some(w)
    }

    pub fn cursor_mut(&mut self, i: usize) -> &mut C {
        &mut self.cursors[i]
    }

    /// Number of inputs.
    pub fn len(&self) -> usize {
        self.cursors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cursors.is_empty()
    }

    pub fn cursor(&self, i: usize) -> &C {
        &self.cursors[i]
    }

    /// Replays the winner's path after it advanced.
    pub fn replay(&mut self) {
        let k = self.cursors.len();
        let mut winner = self.tree[0];
        let mut node = (winner + k) / 2;
        while node >= 1 {
            let other = self.tree[node];
            if self.beats(other, winner) {
                self.tree[node] = winner;
                winner = other;
            }
            node /= 2;
        }
        self.tree[0] = winner;
    }

    pub fn into_cursors(self) -> Vec<C> {
        self.cursors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct VecCursor {
        values: Vec<(u8, usize)>,
        at: usize,
    }

    impl MergeCursor for VecCursor {
        fn is_done(&self) -> bool {
            self.at >= self.values.len()
        }
        fn less_than(&self, other: &Self) -> bool {
            self.values[self.at].0 < other.values[other.at].0
        }
    }

    #[test]
    fn merges_like_a_stable_sort_at_odd_fan_ins() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        for k in [1usize, 2, 3, 5, 7, 8, 49, 50, 51] {
            let mut inputs = vec![];
            let mut all = vec![];
            for i in 0..k {
                let len = next() % 20; // some inputs empty
                let mut v: Vec<(u8, usize)> = (0..len).map(|_| ((next() % 6) as u8, i)).collect();
                v.sort_by_key(|x| x.0);
                all.extend(v.iter().copied());
                inputs.push(VecCursor { values: v, at: 0 });
            }
            all.sort_by_key(|x| x.0); // stable: input order among equals
            let mut tree = LoserTree::new(inputs);
            let mut out = vec![];
            while let Some(w) = tree.winner() {
                let c = tree.cursor_mut(w);
                out.push(c.values[c.at]);
                c.at += 1;
                tree.replay();
            }
            assert_eq!(out, all, "k = {k}");
        }
        assert!(LoserTree::<VecCursor>::new(vec![]).winner().is_none());
    }
}
