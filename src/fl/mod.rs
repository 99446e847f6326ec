//! Federated learning with differential privacy and compressive sensing
//! (`../shared/papers/compression-boosts-dp-fl.txt`, issue 7). So far: the orthonormal DCT-II
//! (`dct`) and the shuffled, chunked first-m DCT compression FL-CS and FL-FREQ send (`sketch`).

pub mod dct;
pub mod sketch;
