//! A dataset's content id: a 64-bit fingerprint of its arrays, written into every dataset and
//! part file, so that what belongs together can be checked cheaply later: a part file copied
//! from another partitioning, a checkpoint resumed on other data, ranks launched on different
//! files. An identity, not an integrity check: it tells datasets apart, it does not prove a
//! file undamaged (the readers' own checks do what can be done there).

use super::{Dataset, Labels};

/// The content id of `ds`: every array (CSR, features, labels, splits) by its length and the
/// CRC-32 of its bytes (little-endian, as stored), plus the shape attributes, folded into 64
/// bits. The name is left out (renaming a dataset does not change its content). CRC-32 runs at
/// memory speed, so a file gets its id for about the cost of reading it once.
pub fn content_id(ds: &Dataset) -> u64 {
    let mut words: Vec<u64> = vec![
        ds.num_nodes,
        ds.first_node,
        ds.num_classes as u64,
        ds.directed as u64,
    ];
    let mut array = |tag: u64, len: usize, bytes: &[u8]| {
        words.extend([tag, len as u64, crc32fast::hash(bytes) as u64]);
    };
    array(1, ds.graph.indptr.len(), bytes_of(&ds.graph.indptr));
    array(2, ds.graph.indices.len(), bytes_of(&ds.graph.indices));
    if let Some(x) = &ds.features {
        let owned;
        let values = match x.as_slice() {
            Some(v) => v,
            None => {
                owned = x.iter().copied().collect::<Vec<f32>>();
                &owned
            }
        };
        array(3, x.ncols(), bytes_of(values));
    }
    match &ds.labels {
        Some(Labels::Class(l)) => array(4, l.len(), bytes_of(l)),
        Some(Labels::Multi(m)) => {
            let owned: Vec<i64> = m.iter().copied().collect();
            array(5, m.ncols(), bytes_of(&owned));
        }
        None => {}
    }
    for (tag, ids) in [
        (6, &ds.splits.train),
        (7, &ds.splits.val),
        (8, &ds.splits.test),
    ] {
        array(tag, ids.len(), bytes_of(ids));
    }
    fnv1a(&words)
}

/// The id of a list of ids (a partition's parts): order matters.
pub fn combine(ids: &[u64]) -> u64 {
    fnv1a(ids)
}

/// The bytes of a slice of plain numbers, as they lie in memory.
fn bytes_of<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `Plain` types are integers and floats: no padding, every byte initialised, and
    // `u8` has alignment 1; the slice covers exactly `v`'s memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Numbers without padding bytes (see [`bytes_of`]).
trait Plain: Copy {}
impl Plain for u32 {}
impl Plain for u64 {}
impl Plain for i64 {}
impl Plain for f32 {}

/// FNV-1a over the little-endian bytes of `words`.
fn fnv1a(words: &[u64]) -> u64 {
    crate::util::hash::fnv1a(words.iter().flat_map(|w| w.to_le_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Csr, Splits};

    fn tiny() -> Dataset {
        Dataset {
            name: "t".into(),
            num_nodes: 3,
            first_node: 0,
            graph: Csr {
                indptr: vec![0, 1, 2, 3],
                indices: vec![1, 2, 0],
            },
            features: Some(ndarray::array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]]),
            labels: Some(Labels::Class(vec![0, 1, 0])),
            num_classes: 2,
            splits: Splits {
                train: vec![0],
                val: vec![1],
                test: vec![2],
            },
            directed: true,
        }
    }

    #[test]
    fn any_change_of_content_changes_the_id_and_the_name_does_not() {
        let base = content_id(&tiny());
        assert_eq!(content_id(&tiny()), base);
        let mut renamed = tiny();
        renamed.name = "other".into();
        assert_eq!(content_id(&renamed), base);
        let changes: [fn(&mut Dataset); 6] = [
            |d| d.graph.indices[0] = 2,
            |d| d.features.as_mut().unwrap()[[2, 1]] = 6.5,
            |d| d.labels = Some(Labels::Class(vec![1, 1, 0])),
            |d| std::mem::swap(&mut d.splits.train, &mut d.splits.val),
            |d| d.directed = false,
            |d| d.features = None,
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut d = tiny();
            change(&mut d);
            assert_ne!(content_id(&d), base, "change {i}");
        }
        // A transposed (non-standard layout) feature matrix hashes its values in row order.
        let mut t = tiny();
        let x = t.features.take().unwrap();
        let mut f = ndarray::Array2::<f32>::zeros((2, 3));
        f.assign(&x.t());
        t.features = Some(f.reversed_axes());
        assert_eq!(content_id(&t), base);
        assert_ne!(combine(&[1, 2]), combine(&[2, 1]));
    }
}
