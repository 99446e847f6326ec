//! The MPI transport under a real launcher: `mpiexec -n W dpcomp check-comm` for W = 1, 2, 4 (the
//! 2-core machine oversubscribes, which MPICH allows): every collective's result checked on
//! every rank by the binary itself, and the bytes each moved as the formulas say. Needs MPICH's
//! `mpiexec` (scripts/setup.sh installs it with the default `mpi` feature).
#![cfg(feature = "mpi")]

use std::process::Command;

#[test]
fn every_collective_checks_out_under_mpiexec_with_1_2_and_4_ranks() {
    for ranks in [1usize, 2, 4] {
        let output = Command::new("mpiexec")
            .args(["-n", &ranks.to_string()])
            .arg(env!("CARGO_BIN_EXE_dpcomp"))
            .args(["check-comm", "--elements", "100003", "--json"])
            .env("DPCOMP_COLLECTIVE_TIMEOUT", "120")
            .output()
            .expect("mpiexec (MPICH) must be installed: scripts/setup.sh installs it");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{ranks} ranks: {stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let report: serde_json::Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{ranks} ranks: one JSON line from rank 0 ({e}): {stdout}"));
        assert_eq!(report["workers"], ranks as u64, "{stdout}");
        // Under mpiexec even one rank runs over MPI (the launcher's variables are set).
        assert_eq!(report["transport"], "MPI", "{stdout}");
        let rows = report["rank0"].as_array().unwrap();
        let names: Vec<&str> = rows
            .iter()
            .map(|r| r["collective"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["all_reduce_sum", "all_gather", "broadcast", "barrier"]
        );
        // Rank 0 sends 4 x 100003 bytes into the all-reduce and 3 + 3 bytes (its 3 (r + 1) plus
        // 100003 mod 1000) into the all-gather, receiving every other rank's 3 (r + 1) + 3.
        if ranks == 1 {
            // Nothing crosses with one rank.
            assert!(rows
                .iter()
                .all(|r| r["sent_bytes"] == 0 && r["received_bytes"] == 0));
            continue;
        }
        assert_eq!(rows[0]["sent_bytes"], 400_012);
        assert_eq!(rows[1]["sent_bytes"], 6);
        let others: u64 = (1..ranks as u64).map(|r| 3 * (r + 1) + 3).sum();
        assert_eq!(rows[1]["received_bytes"], others);
    }
}
