//! How far the ranks drift apart over a stretch of the same work between two collectives.

use crate::backend::Backend;
use crate::comm::World;
use ndarray::Array2;
use std::time::Instant;

/// Repetitions of each drift point. The wait is a mean over them, set by a few long stalls
/// (a rank descheduled for milliseconds), and a step pays it as a share of its work. On the
/// 2-core VM four calibrations with [`REPS`](super::REPS) (5) spread 2.1× (2 ranks) and 3.2×
/// (4 ranks) in drift, which moves a step's prediction by up to a tenth; three with 20 spread
/// 1.7× and 1.45×, for 2-7 s more of calibration.
const DRIFT_REPS: usize = 20;

/// How far the ranks drift apart over a stretch of the same work between two collectives:
/// every rank starts together and runs the same products (`x` = its seconds, mean over ranks),
/// then waits for the slowest (`y` = the slowest rank's seconds less its own, mean over ranks).
/// In a training step every collective waits so for the ranks' drift since the previous one:
/// the wait lands in whichever phase holds the next collective (measured on the 2-core VM:
/// `sample`, `gather` and `allreduce` ran 2-20× their predictions), where the other
/// operators, each timed after a barrier, never see it. On dedicated cores it is near 0.
pub(super) fn drift_points<B: Backend>(be: &B, world: &World) -> Vec<[f64; 2]> {
    let a = be.upload(Array2::from_shape_fn((1024, 256), |(i, j)| ((i + j) % 7) as f32).view());
    let b = be.upload(Array2::from_shape_fn((256, 256), |(i, j)| ((i * j) % 5) as f32).view());
    let work = |products: usize| {
        for _ in 0..products {
            let c = be.matmul(be.view(&a), be.view(&b));
            let _ = be.download(be.rows(be.view(&c), 0..1));
        }
    };
    work(1);
    let ranks = world.size() as f64;
    [1usize, 4, 16]
        .iter()
        .map(|&products| {
            let (mut own, mut waited) = (0.0, 0.0);
            for _ in 0..DRIFT_REPS {
                world.barrier();
                let t = Instant::now();
                work(products);
                let s = t.elapsed().as_secs_f64();
                own += s;
                waited += world.allreduce_max_f64(s) - s;
            }
            let mut sums = [own, waited];
            world.allreduce_sum_f64(&mut sums);
            let n = DRIFT_REPS as f64 * ranks;
            [sums[0] / n, sums[1] / n]
        })
        .collect()
}
