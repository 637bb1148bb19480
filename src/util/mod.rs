//! Small shared helpers: atomic output, logging, prefetch hints, progress reporting, HDF5
//! access with errors that name the file and the field, and visible skips of test cases.

pub mod atomic;
pub mod h5;
pub mod logging;
pub mod prefetch;
pub mod progress;
pub mod rss;
pub mod skip;
