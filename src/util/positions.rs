//! Positions of a rank's own vertices in a list being built (a frontier, the distinct ids
//! asked of an owner), as a table indexed by local id (`v - first`): one array access where
//! a SipHash map per list took about as long as drawing the neighbours (split's build phase
//! ran twice GDP's per sampled edge on the 2-core VM). Every thread keeps one table
//! ([`with_positions`]), as large as its rank's vertex range; a list clears only the entries
//! it set, so a use costs the list's length, not the range's.

use crate::graph::NodeId;
use std::cell::RefCell;

/// Positions of own vertices (`first..first + slot.len()`).
#[derive(Debug, Default)]
pub struct Positions {
    first: u64,
    slot: Vec<u32>,
}

impl Positions {
    const ABSENT: u32 = u32::MAX;

    fn index(&self, v: NodeId) -> usize {
        (v as u64 - self.first) as usize
    }

    /// The position of own vertex `v`, if it has one.
    pub fn get(&self, v: NodeId) -> Option<u32> {
        let p = self.slot[self.index(v)];
        (p != Self::ABSENT).then_some(p)
    }

    /// Give own vertex `v` position `p`.
    pub fn set(&mut self, v: NodeId, p: u32) {
        let i = self.index(v);
        self.slot[i] = p;
    }

    /// The position of `v` in `list`, appending it when it has none.
    pub fn get_or_push(&mut self, v: NodeId, list: &mut Vec<NodeId>) -> u32 {
        self.get(v).unwrap_or_else(|| {
            let p = list.len() as u32;
            self.set(v, p);
            list.push(v);
            p
        })
    }

    /// Give the vertices of `list` (distinct, own) their positions in it.
    pub fn place(&mut self, list: &[NodeId]) {
        for (p, &v) in list.iter().enumerate() {
            self.set(v, p as u32);
        }
    }

    /// Forget the positions of `list`'s vertices (every vertex that has one, before the table
    /// goes back to its thread).
    pub fn clear(&mut self, list: &[NodeId]) {
        for &v in list {
            self.set(v, Self::ABSENT);
        }
    }
}

thread_local! {
    static TABLE: RefCell<Positions> = RefCell::default();
}

/// Run `f` with this thread's table for the `local` own vertices from `first`; `f` clears
/// what it set. The table is taken out of its cell for the call, so a nested call gets a
/// fresh one instead of a borrow error.
pub fn with_positions<R>(first: u64, local: usize, f: impl FnOnce(&mut Positions) -> R) -> R {
    let mut table = TABLE.with(RefCell::take);
    if table.first != first || table.slot.len() != local {
        table = Positions {
            first,
            slot: vec![Positions::ABSENT; local],
        };
    }
    let r = f(&mut table);
    debug_assert!(
        table.slot.iter().all(|&p| p == Positions::ABSENT),
        "every position set was cleared"
    );
    TABLE.with(|t| t.replace(table));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_the_list_and_are_cleared_for_the_next_use() {
        let mut list = vec![103, 100];
        let got = with_positions(100, 8, |p| {
            p.place(&list);
            let asked: Vec<u32> = [100, 107, 103, 107]
                .iter()
                .map(|&v| p.get_or_push(v, &mut list))
                .collect();
            assert_eq!(p.get(101), None);
            p.clear(&list);
            asked
        });
        assert_eq!(got, vec![1, 2, 0, 2]);
        assert_eq!(list, vec![103, 100, 107]);
        // The same thread's next use starts from an empty table.
        with_positions(100, 8, |p| assert_eq!(p.get(107), None));
    }
}
