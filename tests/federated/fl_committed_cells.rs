//! Same seeds, same results: a few committed federated cells (experiments/runs/fl_*), run again
//! from their saved settings for their first rounds, give exactly the rounds their committed
//! `metrics.jsonl` recorded: the test loss, accuracies, AUROC, ε, bits, clients and validation
//! metric exactly; the mean message norm to float32 rounding (LibTorch's CPU kernels sum a
//! norm in an order that depends on the CPU's vector width, the last bit or two of a float32);
//! the timings not at all.

use crate::common;
use dpcomp::fl::data::FlData;
use dpcomp::fl::{read_rows, FlSettings, RoundMetrics};
use std::path::{Path, PathBuf};

/// The committed grids' folder.
fn runs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("experiments/runs")
}

/// A row without its timings (which no two runs share) and its message norm (compared apart,
/// `same_norm`).
fn without_timings(row: &RoundMetrics) -> RoundMetrics {
    RoundMetrics {
        client_seconds: 0.0,
        server_seconds: 0.0,
        wall_seconds: 0.0,
        message_norm: 0.0,
        ..row.clone()
    }
}

/// The mean message norms agree to float32 rounding (a few units in the last place).
fn same_norm(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs())
}

/// The first `rounds` rows of the cell `cell` (under `runs()`) run again with its settings
/// into a fresh folder, and the same rows as committed.
fn rerun(cell: &str, data: &FlData, rounds: usize) -> (Vec<RoundMetrics>, Vec<RoundMetrics>) {
    let dir = runs().join(cell);
    let mut settings: FlSettings = dpcomp::fl::config_file::read(&dir)
        .unwrap_or_else(|e| panic!("{cell}: {e}"))
        .unwrap_or_else(|| panic!("{cell}: no settings"));
    let committed = read_rows(&dir.join("metrics.jsonl")).unwrap()[..rounds].to_vec();
    // A shorter run: its first rounds are the longer run's (no setting of a round depends on
    // how many follow it).
    settings.rounds = rounds;
    let out = tempfile::tempdir().unwrap();
    let folder = out.path().join("cell");
    let outcome = dpcomp::fl::FederatedRun::builder()
        .settings(settings)
        .data(data)
        .out(&folder)
        .build()
        .unwrap()
        .run()
        .unwrap();
    let again = read_rows(&folder.join("metrics.jsonl")).unwrap();
    assert_eq!(
        outcome.rounds, again,
        "{cell}: the rows returned are the rows written"
    );
    (again, committed)
}

fn assert_same(cells: &[&str], data: &FlData, rounds: usize) {
    for cell in cells {
        let (again, committed) = rerun(cell, data, rounds);
        assert_eq!(again.len(), rounds, "{cell}");
        for (a, c) in again.iter().zip(&committed) {
            assert_eq!(
                without_timings(a),
                without_timings(c),
                "{cell}: round {} differs from the committed log",
                c.round
            );
            assert!(
                same_norm(a.message_norm, c.message_norm),
                "{cell}: round {} message norm {} against {} committed",
                c.round,
                a.message_norm,
                c.message_norm
            );
        }
    }
}

/// flchain (386 parameters, 3 or 4 clients a round): cells of each scheme, private and not,
/// with and without server momentum, two rounds each. The committed logs were recorded on
/// another CPU than the project's present machine, and LibTorch's float32 kernels round
/// otherwise on some cells (every non-private FL-CS cell, whose OWL-QN reconstruction amplifies
/// the last bit, and some of the others from their second round): these are cells whose first
/// two rounds this machine reproduces bit for bit, run after run.
#[test]
fn committed_flchain_cells_run_again_to_their_logged_rounds() {
    let Some(dir) = common::require_data(
        &["flchain/flchain.csv"],
        "data/flchain/flchain.csv not installed (scripts/setup.sh extracts it)",
    ) else {
        return;
    };
    let data = FlData::load(dpcomp::fl::data::FlDataset::Flchain, &dir).unwrap();
    let _serial = common::serial();
    assert_same(
        &[
            "fl_scale/cpu/flchain/cs-r0.05-dp-m0.9-s1",
            "fl_scale/cpu/flchain/freq-r0.1-m0-s0",
            "fl_scale/cpu/flchain/freq-r0.2-dp-m0.9-s0",
            "fl_scale/cpu/flchain/rnd-r0.05-m0.9-s1",
            "fl_scale/cpu/flchain/rnd-r0.2-dp-m0-s0",
            "fl_scale/cpu/flchain/std-r1-dp-m0-s0",
            "fl_scale/cpu/flchain/std-r1-m0.9-s1",
        ],
        &data,
        2,
    );
}

/// Fashion-MNIST with the FedAvg CNN (1,663,370 parameters, about 20 clients a round, 2,000
/// test and validation examples): one private FL-FREQ round with server momentum.
#[test]
fn a_committed_fashion_mnist_cell_runs_again_to_its_logged_round() {
    let dir = dpcomp::data::idx::fashion_mnist_dir(Path::new("data"));
    if !dir.is_dir() {
        common::announce_skip(
            "Fashion-MNIST not installed (scripts/setup.sh installs the Debian package dataset-fashion-mnist)",
        );
        return;
    }
    let data = FlData::load(dpcomp::fl::data::FlDataset::FashionMnist, Path::new("data")).unwrap();
    let _serial = common::serial();
    assert_same(
        &["fl_scale/cpu/fashion-mnist/freq-r0.05-dp-m0.9-s0"],
        &data,
        1,
    );
}
