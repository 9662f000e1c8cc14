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
//! Inputs are [`MergeCursor`]s. Each node holds its player's key prefix
//! beside the input's number, so a match compares two integers held in the
//! tree and touches no cursor unless the prefixes tie on a longer key; the
//! replay picks winner and loser as selects, not as a branch on the
//! outcome, which on random keys is a coin toss a predictor misses half
//! the time.
//! A finished input plays as prefix `u128::MAX` with a number past every
//! live one, so it loses to everything, and ties go to the lower input
//! index: merging runs in their order keeps equal keys in input order (the
//! merge is stable).

/// One sorted input of a merge.
pub trait MergeCursor {
    /// No element left.
    fn is_done(&self) -> bool;
    /// An order-preserving prefix of the current element's key (not done):
    /// an element with a smaller prefix sorts first. Equal prefixes are
    /// decided by [`MergeCursor::less_than`], unless the tree was built
    /// with [`LoserTree::new_keyed_by_prefix`]. The default, 0 for every
    /// element, leaves every match to `less_than`.
    fn prefix(&self) -> u128 {
        0
    }
    /// Whether this input's current element sorts before `other`'s
    /// (both not done).
    fn less_than(&self, other: &Self) -> bool;
}

/// A player in the tree: the input's number (`k` and up: the input
/// `number - k`, done) and its current prefix.
#[derive(Clone, Copy)]
struct Player {
    prefix: u128,
    number: usize,
}

/// The merge state over `k` cursors.
pub struct LoserTree<C> {
    cursors: Vec<C>,
    /// `tree[0]` is the winner; `tree[1..k]` the losers of inner nodes.
    tree: Vec<Player>,
    /// Equal prefixes mean equal keys: `less_than` is never called.
    prefix_is_key: bool,
}

impl<C: MergeCursor> LoserTree<C> {
    /// Plays the initial tournament; prefixes that tie are decided by
    /// [`MergeCursor::less_than`].
    pub fn new(cursors: Vec<C>) -> Self {
        Self::build_tree(cursors, false)
    }

    /// As [`LoserTree::new`], for cursors whose prefix is their whole key
    /// (keys of at most 16 bytes): equal prefixes are equal keys.
    pub fn new_keyed_by_prefix(cursors: Vec<C>) -> Self {
        Self::build_tree(cursors, true)
    }

    fn build_tree(cursors: Vec<C>, prefix_is_key: bool) -> Self {
        let k = cursors.len();
        let none = Player {
            prefix: u128::MAX,
            number: usize::MAX,
        };
        let mut this = Self {
            cursors,
            tree: vec![none; k.max(1)],
            prefix_is_key,
        };
        if k > 0 {
            let winner = this.build(1);
            this.tree[0] = winner;
        }
        this
    }

    /// Input `i` as it plays now.
    #[inline]
    fn player(&self, i: usize) -> Player {
        let c = &self.cursors[i];
        match c.is_done() {
            true => Player {
                prefix: u128::MAX,
                number: i + self.cursors.len(),
            },
            false => Player {
                prefix: c.prefix(),
                number: i,
            },
        }
    }

    /// Fills the subtree at inner node `node` (leaves are `k..2k`); returns
    /// its winner.
    fn build(&mut self, node: usize) -> Player {
        let k = self.cursors.len();
        if node >= k {
            return self.player(node - k);
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

    /// Whether player `a` wins against player `b`.
    #[inline(always)]
    fn beats(&self, a: Player, b: Player) -> bool {
        if a.prefix == b.prefix && !self.prefix_is_key {
            let k = self.cursors.len();
            if a.number < k && b.number < k {
                let (ca, cb) = (&self.cursors[a.number], &self.cursors[b.number]);
                if ca.less_than(cb) {
                    return true;
                }
                if cb.less_than(ca) {
                    return false;
                }
            }
        }
        (a.prefix < b.prefix) | ((a.prefix == b.prefix) & (a.number < b.number))
    }

    /// The input holding the smallest current element, if any is left.
    pub fn winner(&self) -> Option<usize> {
        let w = self.tree.first()?.number;
        (w < self.cursors.len()).then_some(w)
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
        let Some(w) = self.winner() else {
            return;
        };
        let mut winner = self.player(w);
        let mut node = (w + k) / 2;
        while node >= 1 {
            let other = self.tree[node];
            let swap = self.beats(other, winner);
            // Selects, not branches: see the module doc.
            self.tree[node] = if swap { winner } else { other };
            winner = if swap { other } else { winner };
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

    /// How a test cursor's prefix relates to its key.
    #[derive(Clone, Copy, Debug)]
    enum Prefix {
        /// The trait's default: 0 for all, `less_than` decides.
        Default,
        /// The whole key, the largest key as `u128::MAX` (a live input
        /// playing the prefix finished inputs play).
        Whole,
        /// Half the key: pairs of keys tie and `less_than` decides.
        Half,
    }

    struct VecCursor {
        values: Vec<(u8, usize)>,
        at: usize,
        prefix: Prefix,
    }

    const KEY_MAX: u8 = 5;

    impl MergeCursor for VecCursor {
        fn is_done(&self) -> bool {
            self.at >= self.values.len()
        }
        fn prefix(&self) -> u128 {
            let v = self.values[self.at].0;
            match self.prefix {
                Prefix::Default => 0,
                Prefix::Whole if v == KEY_MAX => u128::MAX,
                Prefix::Whole => v as u128,
                Prefix::Half => (v / 2) as u128,
            }
        }
        fn less_than(&self, other: &Self) -> bool {
            assert!(
                !matches!(self.prefix, Prefix::Whole),
                "a tree keyed by prefix never asks"
            );
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
        for prefix in [Prefix::Default, Prefix::Whole, Prefix::Half] {
            for k in [1usize, 2, 3, 5, 7, 8, 49, 50, 51] {
                let mut inputs = vec![];
                let mut all = vec![];
                for i in 0..k {
                    let len = next() % 20; // some inputs empty
                    let key = |x: usize| (x % (KEY_MAX as usize + 1)) as u8;
                    let mut v: Vec<(u8, usize)> = (0..len).map(|_| (key(next()), i)).collect();
                    v.sort_by_key(|x| x.0);
                    all.extend(v.iter().copied());
                    let at = 0;
                    inputs.push(VecCursor {
                        values: v,
                        at,
                        prefix,
                    });
                }
                all.sort_by_key(|x| x.0); // stable: input order among equals
                let mut tree = match prefix {
                    Prefix::Whole => LoserTree::new_keyed_by_prefix(inputs),
                    _ => LoserTree::new(inputs),
                };
                let mut out = vec![];
                while let Some(w) = tree.winner() {
                    let c = tree.cursor_mut(w);
                    out.push(c.values[c.at]);
                    c.at += 1;
                    tree.replay();
                }
                assert_eq!(out, all, "k = {k}, prefix {prefix:?}");
            }
        }
        assert!(LoserTree::<VecCursor>::new(vec![]).winner().is_none());
    }
}
