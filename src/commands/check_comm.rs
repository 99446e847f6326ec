//! `dpcomp check-comm`: every collective of the workers' transport, checked and timed (what to
//! run on a new hostfile before a long job): `mpiexec -n W dpcomp check-comm`, `torchrun
//! --nproc-per-node W --no-python dpcomp check-comm` (c10d on Gloo; with `--device cuda`, on
//! NCCL where built, and the tensor collectives on the GPU too), or W threads of one process
//! with `--threads W`.

use anyhow::{bail, Result};
use dpcomp::comm::check::{check_collectives, check_tensor_collectives, CheckRow};
use dpcomp::comm::{CommChoice, Communicator, ThreadGroup};

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
    /// Also check the tensor collectives (`all_reduce_tensor`, `all_gather_tensor`) on this
    /// device, and choose the transport for it (see --comm). Without it, the host collectives
    /// only, on the transport for the CPU.
    #[arg(long, value_enum)]
    pub device: Option<dpcomp::config::DeviceChoice>,
    /// Under torchrun, the c10d backend: auto (NCCL for --device cuda where this build has it,
    /// Gloo otherwise), gloo, or nccl (CUDA only; host collectives on Gloo).
    #[arg(long, value_enum, default_value_t = CommChoice::Auto)]
    pub comm: CommChoice,
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

/// The host collectives' rows, then the tensor collectives' on `device` where one is given.
fn check_all(
    comm: &mut dyn Communicator,
    elements: usize,
    device: Option<tch::Device>,
) -> dpcomp::Result<Vec<CheckRow>> {
    let mut rows = check_collectives(comm, elements)?;
    if let Some(device) = device {
        rows.extend(check_tensor_collectives(comm, elements, device)?);
    }
    Ok(rows)
}

pub fn run(args: CheckCommArgs) -> Result<()> {
    if args.elements > MAX_ELEMENTS {
        bail!(
            "--elements {}: expected 0 to {MAX_ELEMENTS} f32 values (1 GiB a worker)",
            args.elements
        );
    }
    if let Some(size) = args.threads {
        super::check_thread_workers("--threads", size)?;
        let elements = args.elements;
        let device = match args.device {
            Some(choice) => Some(choice.device()?),
            None => None,
        };
        let handles: Vec<_> = ThreadGroup::ranks(size)
            .into_iter()
            .map(|mut comm| std::thread::spawn(move || check_all(&mut comm, elements, device)))
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
    let device = match args.device {
        Some(choice) => Some(choice.device()?),
        None => None,
    };
    let (mut comm, transport): (Box<dyn Communicator>, &str) =
        super::world_on(device.unwrap_or(tch::Device::Cpu), args.comm)?;
    match check_all(comm.as_mut(), args.elements, device) {
        Ok(rows) => {
            if comm.rank() == 0 {
                report(comm.size(), transport, &rows, args.json)?;
            }
            Ok(())
        }
        Err(e) => {
            dpcomp::comm::end_job(comm.as_mut(), &e.to_string());
            // Printed; a transport without an abort (c10d) returns here.
            std::process::exit(1)
        }
    }
}
