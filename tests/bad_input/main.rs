//! Bad input to the library and the command line: clear errors, nothing lost.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod reliability;
mod reliability_round_three;
mod reliability_round_three_cli;
mod reliability_round_three_flags;
mod reliability_round_two;
