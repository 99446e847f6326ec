//! How compressible the clients' updates are: compressive sensing recovers an update
//! from m = r n measurements only if it is nearly sparse in the domain it is sensed in. For real
//! client updates of a federated run this measures, at r = 5%, 10% and 20% of n, the share of
//! the update's energy (‖·‖²) held by:
//!
//! - the r n largest coordinates: the sparsity FL-CS's reconstruction exploits, since BPDN
//!   recovers the update s itself, min ½‖A s − y‖² + λ‖s‖₁ over its coordinates, from the
//!   measurements y = A s (A: the kept DCT rows of the shuffled chunks, incoherent with the
//!   coordinates);
//! - the r n largest DCT coefficients of the update shuffled and cut into chunks
//!   (`compress::chunked_dct`): what the best r n coefficients of that transform keep;
//! - the first r L coefficients of every shuffled chunk: what FL-CS's measurements hold, and what
//!   zero filling them would recover;
//! - the first r L coefficients of every unshuffled chunk: what FL-FREQ keeps (its updates'
//!   smoothness along the parameter order).
//!
//! A random (incompressible) vector keeps about r of its energy in any r n coefficients of an
//! orthonormal transform; the further above r, the more a sketch of that size can recover.

use super::client::{client_update, LocalTraining};
use super::data::FlData;
use super::model::FlNet;
use crate::compress::chunked_dct::{ChunkedDct, DctRows};
use crate::compress::dct::dct;
use crate::error::Result;
use crate::host;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use tch::{Device, Kind, Tensor};

/// The shares measured for one update.
#[derive(Debug, Clone, Serialize)]
pub struct EnergyShares {
    /// r = m / n, the share of the n values kept.
    pub ratio: f64,
    /// Energy share of the r n largest coordinates (what BPDN can recover).
    pub top_coordinates: f64,
    /// Energy share of the r n largest DCT coefficients of the shuffled chunks.
    pub top_shuffled_dct: f64,
    /// Energy share of the first r L DCT coefficients of every shuffled chunk (FL-CS's
    /// measurements).
    pub first_shuffled_dct_rows: f64,
    /// Energy share of the first r L DCT coefficients of every unshuffled chunk (what FL-FREQ
    /// keeps).
    pub first_dct_rows_unshuffled: f64,
}

/// Energy shares of `update` \[n\] at ratio `r`, with chunks of about 1,024 (the default P).
pub fn energy_shares(update: &Tensor, ratio: f64, seed: u64) -> Result<EnergyShares> {
    let n = update.size()[0];
    let chunks = (n + 1023) / 1024;
    let update = update.to_kind(Kind::Double);
    let total = host::f64_scalar(&update.square().sum(Kind::Double)).max(1e-300);
    let top = |values: &Tensor, k: i64| -> f64 {
        let squares = values.reshape([-1]).square();
        let (largest, _) = squares.topk(k.max(1), 0, true, false);
        host::f64_scalar(&largest.sum(Kind::Double)) / total
    };
    let first_rows = |coefficients: &Tensor, kept: i64| -> f64 {
        host::f64_scalar(&coefficients.narrow(1, 0, kept).square().sum(Kind::Double)) / total
    };
    let k = (ratio * n as f64).round() as i64;
    let shuffled = ChunkedDct::new(
        n,
        ratio,
        chunks,
        Some(seed),
        DctRows::First,
        update.device(),
    )?;
    let plain = ChunkedDct::new(n, ratio, chunks, None, DctRows::First, update.device())?;
    let shuffled_coefficients = dct(&shuffled.shuffle(&update));
    let plain_coefficients = dct(&plain.shuffle(&update));
    Ok(EnergyShares {
        ratio,
        top_coordinates: top(&update, k),
        top_shuffled_dct: top(&shuffled_coefficients, k),
        first_shuffled_dct_rows: first_rows(&shuffled_coefficients, shuffled.kept),
        first_dct_rows_unshuffled: first_rows(&plain_coefficients, plain.kept),
    })
}

/// One network's measurement: the mean shares over `clients` client updates in each of
/// `rounds` FedAvg rounds (no privacy, no compression: the updates as clients compute them).
#[derive(Debug, Clone, Serialize)]
pub struct SparsityReport {
    /// The network's name (`FlNet::name`).
    pub model: String,
    /// n, the network's parameter count.
    pub parameters: i64,
    /// Client updates measured (`clients` × `rounds`).
    pub updates: usize,
    /// The mean shares, one entry per ratio r asked for.
    pub shares: Vec<EnergyShares>,
}

/// Measures `net` on `data` (Fashion-MNIST's IID split into `clients_total` clients of equal
/// size), `clients` random clients a round for `rounds` FedAvg rounds, with `local` training.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    data: &FlData,
    net: FlNet,
    clients_total: usize,
    clients: usize,
    rounds: usize,
    local: &LocalTraining,
    ratios: &[f64],
    seed: u64,
) -> Result<SparsityReport> {
    tch::manual_seed(seed as i64);
    let device = Device::Cpu;
    let mut model = data.model(Some(net), device)?;
    let mut global = model.flat();
    let n = global.size()[0];
    let per_client = data.train_len() / clients_total.max(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..clients_total).collect();
    let mut sums = vec![[0.0f64; 4]; ratios.len()];
    let mut updates = 0;
    for round in 0..rounds {
        order.shuffle(&mut rng);
        let mut mean = Tensor::zeros([n], (Kind::Float, device));
        for (i, &client) in order.iter().take(clients).enumerate() {
            let examples: Vec<i64> =
                ((client * per_client) as i64..((client + 1) * per_client) as i64).collect();
            let update = client_update(
                &mut model,
                &global,
                &data.train_x,
                &data.train_y,
                &examples,
                local,
                seed ^ ((round * 1000 + i) as u64),
            )?;
            for (sum, &ratio) in sums.iter_mut().zip(ratios) {
                let s = energy_shares(&update, ratio, seed)?;
                sum[0] += s.top_coordinates;
                sum[1] += s.top_shuffled_dct;
                sum[2] += s.first_shuffled_dct_rows;
                sum[3] += s.first_dct_rows_unshuffled;
            }
            mean += update / clients as f64;
            updates += 1;
        }
        global += mean;
    }
    let shares = ratios
        .iter()
        .zip(&sums)
        .map(|(&ratio, sum)| EnergyShares {
            ratio,
            top_coordinates: sum[0] / updates as f64,
            top_shuffled_dct: sum[1] / updates as f64,
            first_shuffled_dct_rows: sum[2] / updates as f64,
            first_dct_rows_unshuffled: sum[3] / updates as f64,
        })
        .collect();
    Ok(SparsityReport {
        model: net.name().to_string(),
        parameters: n,
        updates,
        shares,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vector with all its energy in 3% of its coordinates keeps it all among the top 5%; a
    /// smooth vector (a low DCT frequency per unshuffled chunk) keeps it in the first rows.
    #[test]
    fn shares_of_known_vectors() {
        let _serial = crate::test_serial();
        let n = 4096i64;
        let sparse = Tensor::zeros([n], (Kind::Float, Device::Cpu));
        for i in 0..(n * 3 / 100) {
            let _ = sparse.get(i * 33 % n).fill_(1.0 + i as f64);
        }
        let s = energy_shares(&sparse, 0.05, 7).unwrap();
        assert!((s.top_coordinates - 1.0).abs() < 1e-9, "{s:?}");
        let t = Tensor::arange(n, (Kind::Float, Device::Cpu)).remainder(1024) / 1024.0;
        let smooth = (t * std::f64::consts::PI).cos();
        let s = energy_shares(&smooth, 0.05, 7).unwrap();
        assert!(s.first_dct_rows_unshuffled > 0.99, "{s:?}");
        // Shuffling spreads it over every coefficient: about r of the energy in r of the rows.
        assert!(s.first_shuffled_dct_rows < 0.15, "{s:?}");
    }
}
