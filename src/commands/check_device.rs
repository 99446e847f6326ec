//! `dpcomp check-device`: correctness on one device, the GPU kit's first step.

use anyhow::Result;
use dpcomp::error::Error;
use dpcomp_lab::bench;

pub fn run(args: bench::device_check::CheckDeviceArgs) -> Result<()> {
    let report = bench::device_check::run(&args)?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.json_out {
        std::fs::write(path, &json).map_err(|e| Error::io(path, e))?;
    }
    println!("{json}");
    for check in report.checks.iter().filter(|c| !c.passed) {
        eprintln!(
            "FAILED {}: error {:e} above {:e} ({})",
            check.name, check.error, check.tolerance, check.detail
        );
    }
    if !report.passed {
        return Err(anyhow::anyhow!(
            "check-device: some checks failed on {}",
            report.device
        ));
    }
    Ok(())
}
