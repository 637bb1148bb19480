//! Baseline partitions to compare METIS against: seeded random with equal part sizes, and a
//! fixed hash of the vertex id.

/// SplitMix64 step: a well-mixed 64-bit function, used both as a hash and as a PRNG.
#[inline]
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded random partition with balanced sizes: a seeded permutation of the vertices cut
/// into `parts` ranges of equal size (±1). Deterministic for a seed.
///
/// Vertex ids are `NodeId` (u32): `n` is at most 2^32 (the dataset reader refuses more), so
/// every id fits; nothing here is limited to 2^31 the way METIS is.
pub fn random(n: usize, parts: usize, seed: u64) -> Vec<u32> {
    debug_assert!(n as u64 <= u32::MAX as u64 + 1);
    let mut order: Vec<u32> = (0..n).map(|v| v as u32).collect();
    // Fisher–Yates driven by a counter-based stream: draw i depends only on (seed, i).
    let key = splitmix64(seed ^ 0x5241_4e44_4f4d_0000);
    for i in (1..n).rev() {
        let r = splitmix64(key.wrapping_add(i as u64));
        // Multiply-shift maps r to 0..=i without modulo bias worth caring about here.
        let j = ((r as u128 * (i as u128 + 1)) >> 64) as usize;
        order.swap(i, j);
    }
    let mut part = vec![0u32; n];
    for p in 0..parts {
        // In u128 so the range bounds are exact whatever n and parts (below 2^32 each,
        // p × n still fits 64 bits, but this costs nothing).
        let cut = |p: usize| (p as u128 * n as u128 / parts as u128) as usize;
        let (lo, hi) = (cut(p), cut(p + 1));
        for &v in &order[lo..hi] {
            part[v as usize] = p as u32;
        }
    }
    part
}

/// Part of vertex `v` under the hash baseline: a fixed integer hash of its id, modulo `parts`.
#[inline]
pub fn hash_part(v: u64, parts: usize) -> u32 {
    (splitmix64(v) % parts as u64) as u32
}

/// The hash partition of `n` vertices.
pub fn hash(n: usize, parts: usize) -> Vec<u32> {
    (0..n as u64).map(|v| hash_part(v, parts)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_is_balanced_seeded_and_deterministic() {
        let a = random(103, 4, 7);
        assert_eq!(a, random(103, 4, 7));
        assert_ne!(a, random(103, 4, 8));
        let mut sizes = [0usize; 4];
        a.iter().for_each(|&p| sizes[p as usize] += 1);
        assert!(sizes.iter().all(|&s| s == 25 || s == 26), "{sizes:?}");
    }

    #[test]
    fn hash_spreads_consecutive_ids() {
        let h = hash(1000, 4);
        let mut sizes = [0usize; 4];
        h.iter().for_each(|&p| sizes[p as usize] += 1);
        assert!(sizes.iter().all(|&s| s > 200), "{sizes:?}");
        assert_eq!(h[17], hash_part(17, 4));
    }
}
