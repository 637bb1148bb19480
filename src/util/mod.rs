//! Small shared helpers: atomic output, logging, prefetch hints, progress reporting, own
//! vertices' positions in lists being built, HDF5
//! access with errors that name the file and the field, and visible skips of test cases.

pub mod atomic;
pub mod h5;
pub mod hash;
pub mod huge_pages;
pub mod logging;
pub mod positions;
pub mod prefetch;
pub mod progress;
pub mod rss;
pub mod skip;
