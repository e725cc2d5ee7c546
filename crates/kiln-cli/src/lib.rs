//! The parts of the `kiln` command that other programs (the fuzz targets) reach: reading and
//! writing NumPy files as the CLI does.

pub mod calibration;
pub mod npy;
