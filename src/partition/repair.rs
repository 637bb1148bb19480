//! No empty parts: METIS may leave parts empty when they are nearly as many as the vertices
//! (and the hash baseline does so by chance), while training assumes every part owns a
//! vertex. [`fill_empty_parts`] repairs any assignment deterministically.

use crate::graph::Csr;

/// Give every empty part one vertex, in part order: each takes a vertex of the currently
/// largest part (ties: lowest part id), the one whose move cuts the fewest stored edges,
/// i.e. with the fewest stored edges (either direction, self-loops aside) to vertices of its
/// current part (ties: lowest vertex id). The receiving part is empty, so no cut edge is
/// saved by the move. Returns how many parts were empty.
///
/// Needs `part.len() >= parts` (then the largest part always has at least two vertices while
/// a part is empty, so no part is emptied by a move). Costs O(n + m) per empty part, which
/// only matters when parts are nearly as many as vertices.
pub fn fill_empty_parts(graph: &Csr, part: &mut [u32], parts: usize) -> usize {
    let n = part.len();
    assert!(
        n >= parts,
        "internal: {parts} parts for {n} vertices (checked by the caller)"
    );
    assert_eq!(graph.num_rows(), n, "internal: one part per vertex");
    let mut sizes = vec![0u64; parts];
    for &p in part.iter() {
        sizes[p as usize] += 1;
    }
    let empty: Vec<usize> = (0..parts).filter(|&p| sizes[p] == 0).collect();
    if empty.is_empty() {
        return 0;
    }
    let mut inside = vec![0u64; n];
    for &to in &empty {
        let from = (0..parts)
            .max_by_key(|&p| (sizes[p], std::cmp::Reverse(p)))
            .expect("at least one part");
        debug_assert!(sizes[from] >= 2);
        inside.iter_mut().for_each(|c| *c = 0);
        for u in 0..n {
            if part[u] as usize != from {
                continue;
            }
            for &v in graph.neighbors(u) {
                let v = v as usize;
                if v != u && part[v] as usize == from {
                    inside[u] += 1;
                    inside[v] += 1;
                }
            }
        }
        let v = (0..n)
            .filter(|&v| part[v] as usize == from)
            .min_by_key(|&v| (inside[v], v))
            .expect("the largest part is not empty");
        part[v] = to as u32;
        sizes[from] -= 1;
        sizes[to] += 1;
    }
    empty.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(part: &[u32], parts: usize) -> Vec<usize> {
        let mut s = vec![0; parts];
        part.iter().for_each(|&p| s[p as usize] += 1);
        s
    }

    #[test]
    fn fills_each_empty_part_from_the_largest_with_the_cheapest_vertex() {
        // Edges (stored one way unless noted): 0→1, 1→2, 2→0 (a triangle), 3→0, 4→4 (loop),
        // 5→6, 6→5, 7→5.
        let g = Csr::from_edges(8, &[0, 1, 2, 3, 4, 5, 6, 7], &[1, 2, 0, 0, 4, 6, 5, 5]);
        // Part 0 = {0, 1, 2, 3, 4} (largest), part 2 = {5, 6, 7}; parts 1, 3 and 4 empty.
        let mut part = vec![0, 0, 0, 0, 0, 2, 2, 2];
        assert_eq!(fill_empty_parts(&g, &mut part, 5), 3);
        // Part 1 ← part 0 (5 vertices). Edges inside part 0: 0:3 (1, 2, 3), 1:2, 2:2, 3:1,
        // 4:0 (its loop does not count) → vertex 4.
        // Part 3 ← part 0 (4 vertices vs 3). Inside: 0:3, 1:2, 2:2, 3:1 → vertex 3.
        // Part 4 ← part 0 and part 2 both hold 3: the lower id, part 0. Inside {0, 1, 2}:
        // 2 each → the lowest id, vertex 0.
        assert_eq!(part, vec![4, 0, 0, 3, 1, 2, 2, 2]);
        assert_eq!(sizes(&part, 5), vec![2, 1, 3, 1, 1]);
    }

    #[test]
    fn counts_both_directions_and_duplicates() {
        // Part 0 = {0, 1, 2}: 0→1 twice, 2→1 once: inside 0:2, 1:3, 2:1 → vertex 2 moves.
        let g = Csr::from_edges(4, &[0, 0, 2], &[1, 1, 1]);
        let mut part = vec![0, 0, 0, 1];
        assert_eq!(fill_empty_parts(&g, &mut part, 3), 1);
        assert_eq!(part, vec![0, 0, 2, 1]);
    }

    #[test]
    fn leaves_a_full_assignment_alone_and_fills_parts_equal_to_vertices() {
        let g = Csr::from_edges(4, &[0, 1, 2], &[1, 2, 3]);
        let mut part = vec![1, 0, 1, 0];
        assert_eq!(fill_empty_parts(&g, &mut part, 2), 0);
        assert_eq!(part, vec![1, 0, 1, 0]);
        // Everything in part 2 of 4: three parts filled, one vertex each.
        let mut part = vec![2; 4];
        assert_eq!(fill_empty_parts(&g, &mut part, 4), 3);
        assert_eq!(sizes(&part, 4), vec![1, 1, 1, 1]);
        let again = {
            let mut p = vec![2; 4];
            fill_empty_parts(&g, &mut p, 4);
            p
        };
        assert_eq!(part, again, "deterministic");
    }
}
