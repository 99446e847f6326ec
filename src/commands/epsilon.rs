//! `dpcomp epsilon`: ε of DP-SGD for (q, σ, steps, δ), or the σ for a target ε.

use anyhow::Result;
use dpcomp::config::AccountantKind;
use dpcomp::privacy;

#[derive(Debug, clap::Args)]
pub struct EpsilonArgs {
    /// Sampling rate q of each step (Poisson sampling).
    #[arg(long)]
    pub sample_rate: f64,
    /// Noise multiplier sigma (noise std = sigma * C).
    #[arg(
        long,
        required_unless_present = "target_epsilon",
        conflicts_with = "target_epsilon"
    )]
    pub noise_multiplier: Option<f64>,
    /// Print the sigma that reaches this epsilon instead.
    #[arg(long)]
    pub target_epsilon: Option<f64>,
    #[arg(long)]
    pub steps: u64,
    #[arg(long)]
    pub delta: f64,
    #[arg(long, value_enum, default_value = "pld")]
    pub accountant: AccountantKind,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: EpsilonArgs) -> Result<()> {
    let sigma = match (args.noise_multiplier, args.target_epsilon) {
        (Some(sigma), _) => sigma,
        (None, Some(target)) => privacy::calibrate::noise_multiplier_for(
            args.accountant,
            target,
            args.sample_rate,
            args.steps,
            args.delta,
        )?,
        (None, None) => unreachable!("clap requires one of the two"),
    };
    let mut accountant = privacy::accountant::Accountant::default();
    accountant.step(sigma, args.sample_rate, args.steps)?;
    // PLD also reports its grid spacing: coarser than 1e-4 when the loss range needed it.
    let (epsilon, alpha, pld_interval) = match args.accountant {
        AccountantKind::Pld => {
            let p = privacy::pld::epsilon_detailed(&accountant.history, args.delta)?;
            (p.epsilon, None, Some(p))
        }
        AccountantKind::Rdp => {
            let (e, a) = accountant.epsilon_rdp(args.delta)?;
            (e, Some(a), None)
        }
    };
    // σ 0: ε is ∞ at every RDP order, so there is no optimal order (RDP gives NaN for it).
    let alpha = alpha.filter(|a| a.is_finite());
    let order = alpha.map_or(String::new(), |a| format!(" (optimal RDP order {a})"));
    if let Some(reason) = pld_interval.and_then(|p| p.fallback) {
        eprintln!(
            "note: epsilon is the RDP accountant's bound, not the PLD composition's: {reason}"
        );
    } else if let Some(p) = pld_interval.filter(|p| p.coarsened()) {
        eprintln!(
            "note: PLD grid spacing {:.3e} instead of {:e} to stay within {} points \
             (small sigma or many steps); the bound is valid but looser",
            p.interval,
            privacy::pld::DEFAULT_INTERVAL,
            privacy::pld::MAX_FFT_LEN
        );
    }
    if args.json {
        // ε through the run logs' writer: "inf" at σ 0 (serde_json alone writes null).
        let epsilon_json = dpcomp::json_floats::epsilon_json::serialize(
            &Some(epsilon),
            serde_json::value::Serializer,
        )?;
        println!(
            "{}",
            serde_json::json!({"epsilon": epsilon_json, "alpha": alpha, "noise_multiplier": sigma,
                "accountant": args.accountant, "pld_interval": pld_interval.map(|p| p.interval),
                "pld_fallback": pld_interval.and_then(|p| p.fallback).map(|r| r.to_string())})
        );
    } else if epsilon.is_infinite() {
        println!(
            "epsilon inf at delta {}: noise multiplier {sigma} adds no noise, so the steps are \
             not private",
            super::delta_text(args.delta)
        );
    } else if args.target_epsilon.is_some() {
        println!(
            "noise multiplier {sigma:.6} gives epsilon {epsilon:.4}{order} at delta {}",
            super::delta_text(args.delta)
        );
    } else {
        println!(
            "epsilon {epsilon:.4}{order} at delta {}",
            super::delta_text(args.delta)
        );
    }
    Ok(())
}
