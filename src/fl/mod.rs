//! Federated learning with differential privacy and compressive sensing
//! (`../shared/papers/compression-boosts-dp-fl.txt`, issue 7).

pub mod dct;
pub mod owlqn;
pub mod sketch;
