//! `dpcomp check-comm`: every collective of the workers' transport, checked and timed (what to
//! run on a new hostfile before a long job): `mpiexec -n W dpcomp check-comm`, `torchrun
//! --nproc-per-node W --no-python dpcomp check-comm`, or W threads of one process with
//! `--threads W`.

use anyhow::{bail, Result};
use dpcomp::comm::check::{check_collectives, CheckRow};
use dpcomp::comm::{Communicator, ThreadGroup};

#[derive(Debug, clap::Args)]
pub struct CheckCommArgs {
    /// W workers as W threads of this process (no MPI; W 1 to 256); without it, the MPI job
    /// this process belongs to (under mpiexec), its c10d process group on Gloo (under torchrun),
    /// or one process. Refused under a launcher of
    /// several processes, which would each run a check of their own.
    #[arg(long)]
    pub threads: Option<usize>,
    /// f32 values in the all-reduce (0 to 268,435,456, 1 GiB a worker).
    #[arg(long, default_value_t = 1 << 20)]
    pub elements: usize,
    #[arg(long)]
    pub json: bool,
}

/// Prints rank 0's rows (every rank checked its own).
fn report(size: usize, transport: &str, rows: &[CheckRow], json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::json!({"workers": size, "transport": transport, "rank0": rows})
        );
        return Ok(());
    }
    println!("{size} worker(s) over {transport}: every collective's result checked on every rank");
    println!(
        "{:<16} {:>12} {:>14} {:>14}",
        "collective", "seconds", "sent bytes", "received bytes"
    );
    for r in rows {
        println!(
            "{:<16} {:>12.6} {:>14} {:>14}",
            r.collective, r.seconds, r.sent_bytes, r.received_bytes
        );
    }
    Ok(())
}

/// The most values `--elements` takes: 2^28 f32, 1 GiB a worker (each holds its own).
pub const MAX_ELEMENTS: usize = 1 << 28;

pub fn run(args: CheckCommArgs) -> Result<()> {
    if args.elements > MAX_ELEMENTS {
        bail!(
            "--elements {}: expected 0 to {MAX_ELEMENTS} f32 values (1 GiB a worker)",
            args.elements
        );
    }
    if let Some(size) = args.threads {
        super::check_thread_workers("--threads", size)?;
        if let Some(processes) = dpcomp::comm::launched_processes().filter(|&p| p > 1) {
            bail!(
                "--threads {size}: an MPI launcher started {processes} processes, which would \
                 each check {size} threads of their own; run `dpcomp check-comm --threads W` \
                 as one process, or `mpiexec -n W dpcomp check-comm` without --threads"
            );
        }
        let elements = args.elements;
        let handles: Vec<_> = ThreadGroup::ranks(size)
            .into_iter()
            .map(|mut comm| std::thread::spawn(move || check_collectives(&mut comm, elements)))
            .collect();
        let mut first = None;
        for handle in handles {
            let rows = handle
                .join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
            first.get_or_insert(rows);
        }
        return report(size, "threads", &first.unwrap_or_default(), args.json);
    }
    let (mut comm, transport): (Box<dyn Communicator>, &str) = super::world()?;
    match check_collectives(comm.as_mut(), args.elements) {
        Ok(rows) => {
            if comm.rank() == 0 {
                report(comm.size(), transport, &rows, args.json)?;
            }
            Ok(())
        }
        Err(e) => {
            dpcomp::comm::end_job(comm.as_mut(), &e.to_string());
            Err(e.into())
        }
    }
}
