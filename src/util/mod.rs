//! Small shared helpers: atomic output, logging, prefetch hints, progress reporting, HDF5
//! access with errors that name the file and the field.

pub mod atomic;
pub mod h5;
pub mod logging;
pub mod prefetch;
pub mod progress;
pub mod rss;
