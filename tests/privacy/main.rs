//! The privacy engine, the accountants and the audits, against Opacus, dp_accounting and their own oracles.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod accountant;
mod audit;
mod audit_training;
mod opacus_habits;
mod privacy_engine;
mod privacy_extremes;
