//! `dpcomp fl`: one federated run (FL-STD, FL-RND, FL-FREQ, FL-CS; DGC, PowerSGD), with or
//! without client-level DP. The compressor is chosen as for `dpcomp train` (`--compressor`,
//! `--rate`, `--rank`, `--compressor-option`); the older `--scheme`/`--ratio` flags still work
//! for one release, with a deprecation warning.

use anyhow::{Context, Result};
use dpcomp::config::{AccountantKind, DeviceChoice};
use dpcomp::data;
use dpcomp::error::Error;
use dpcomp::privacy;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct FlArgs {
    #[arg(long, value_enum, default_value = "fashion-mnist")]
    pub dataset: dpcomp::fl::data::FlDataset,
    /// How the clients compress their updates, as `dpcomp train --compressor`: identity
    /// (FL-STD), fl-rnd, fl-freq, fl-cs (the paper's sketches, summed compressed), dgc or
    /// powersgd (whole updates, each decoded by the server) [default: fl-cs].
    #[arg(long, value_enum)]
    pub compressor: Option<dpcomp::compress::CompressorKind>,
    /// Dense bits / message bits: n / m of the sketches, the paper's r = 1 / rate [default: 10
    /// for the sketches (r 0.1), 1 otherwise].
    #[arg(long)]
    pub rate: Option<f64>,
    /// --compressor powersgd: the rank.
    #[arg(long, default_value_t = 1)]
    pub rank: i64,
    /// Compressor setting KEY=VALUE (repeatable), as `dpcomp train --compressor-option`:
    /// fl-freq and fl-cs chunks (default n / 1024); fl-cs rows (first|random), lambda (0.01),
    /// iterations (OWL-QN per round, 50 in federated runs); dgc and powersgd theirs.
    #[arg(long = "compressor-option", value_name = "KEY=VALUE")]
    pub compressor_options: Vec<dpcomp::compress::Setting>,
    /// Deprecated (one more release): --compressor identity|fl-rnd|fl-freq|fl-cs.
    #[arg(long, value_enum, hide = true)]
    pub scheme: Option<dpcomp::compress::linear_sketch::Scheme>,
    /// Deprecated (one more release): --rate 1/R.
    #[arg(long, hide = true)]
    pub ratio: Option<f64>,
    /// Deprecated (one more release): --compressor-option chunks=P.
    #[arg(long, hide = true)]
    pub chunks: Option<i64>,
    /// Deprecated (one more release): --compressor-option rows=random.
    #[arg(long, value_enum, hide = true)]
    pub rows: Option<dpcomp::compress::chunked_dct::DctRows>,
    /// Deprecated (one more release): --compressor-option lambda=L.
    #[arg(long, hide = true)]
    pub lambda: Option<f64>,
    /// Deprecated (one more release): --compressor-option iterations=I.
    #[arg(long, hide = true)]
    pub owlqn_iterations: Option<usize>,
    /// Client-level DP (needs --target-epsilon or --noise-multiplier).
    #[arg(long)]
    pub dp: bool,
    /// Calibrate σ so that ε after --rounds rounds is at most this.
    #[arg(long, conflicts_with = "noise_multiplier")]
    pub target_epsilon: Option<f64>,
    /// σ: noise N(0, σ² S²) on the sum of the sampled clients' messages.
    #[arg(long)]
    pub noise_multiplier: Option<f64>,
    #[arg(long, default_value_t = 1e-5)]
    pub delta: f64,
    /// S, the clip radius of a message in the domain it is sent in (default: --full-clip × √r,
    /// r = 1 / rate for the sketches).
    #[arg(long)]
    pub clip: Option<f64>,
    /// S₁, the clip radius for a whole update (default: the dataset's, see `dpcomp fl --help`).
    #[arg(long)]
    pub full_clip: Option<f64>,
    #[arg(long, value_enum, default_value = "pld")]
    pub accountant: AccountantKind,
    /// The network: fashion-mnist lenet (default, 5,994 parameters) or fedavg-cnn (McMahan et
    /// al.'s, 1,663,370: the size the paper's costs imply); breast_cancer mlp.
    #[arg(long, value_enum)]
    pub model: Option<dpcomp::fl::model::FlNet>,
    /// Share of the training examples held out of every client for validation: the summary
    /// then adds the round chosen on it, the test metric and ε there (and --patience watches it).
    #[arg(long, default_value_t = 0.0)]
    pub validation: f64,
    /// N (default: 1000 for Fashion-MNIST, 50 for breast cancer).
    #[arg(long)]
    pub clients: Option<usize>,
    /// C, the probability that a client takes part in a round (with --dp at least 1 / N: one
    /// expected client a round).
    #[arg(long)]
    pub fraction: Option<f64>,
    /// T_gd, local steps a round.
    #[arg(long)]
    pub local_steps: Option<usize>,
    /// Examples per local step (0: full-batch gradient descent).
    #[arg(long)]
    pub local_batch: Option<usize>,
    #[arg(long)]
    pub local_lr: Option<f64>,
    /// T_cl.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Stop after this many rounds without improvement (0: never).
    #[arg(long, default_value_t = 0)]
    pub patience: usize,
    /// iid, dirichlet:ALPHA or shards:K.
    #[arg(long, default_value = "iid")]
    pub non_iid: String,
    #[arg(long, default_value_t = 1.0)]
    pub server_lr: f64,
    #[arg(long, default_value_t = 0.0)]
    pub server_momentum: f64,
    /// Test examples evaluated after each round (0: all).
    #[arg(long, default_value_t = 0)]
    pub eval_examples: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run folder for config.toml, metrics.jsonl, summary.json, and a checkpoint after every
    /// round: a run stopped before its end continues after its last round when started again
    /// with the same settings and folder (--rounds may grow, --device change); other settings
    /// are refused, naming each that differs. Only a new, empty or dpcomp run folder is used.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Discard the run already in --out (its checkpoint, logs and summary; nothing else) and
    /// start afresh.
    #[arg(long, requires = "out")]
    pub restart: bool,
    /// Data folder (default: $DPCOMP_DATA, else data/); Fashion-MNIST is read from
    /// <data-dir>/fashion-mnist, else /usr/share/datasets/fashion-mnist.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceChoice,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Audit the run with this many white-box canary clients (each included with
    /// probability 1/2, then sampled like a client); needs --dp. Writes audit.json to --out.
    #[arg(long, value_name = "M")]
    pub audit_canaries: Option<usize>,
    /// "Included" guesses of the audit (default M / 10).
    #[arg(long)]
    pub audit_guesses: Option<usize>,
    /// Dense canary directions instead of one model coordinate each.
    #[arg(long)]
    pub audit_dense: bool,
    #[arg(long, default_value_t = 19)]
    pub audit_seed: u64,
}

/// The compression `dpcomp fl` runs with, and the deprecation warning of the older flags
/// (`--scheme`, `--ratio`, `--chunks`, `--rows`, `--lambda`, `--owlqn-iterations`) when given:
/// they still work for one release, each mapped to the `--compressor`, `--rate` and
/// `--compressor-option` it meant, and are ignored where the scheme ignored them before.
pub fn fl_compression(
    args: &FlArgs,
) -> Result<(dpcomp::config::CompressionSettings, Option<String>)> {
    use dpcomp::compress::chunked_dct::DctRows;
    use dpcomp::compress::linear_sketch::Scheme;
    use dpcomp::compress::CompressorKind;
    let kind = match (args.compressor, args.scheme) {
        (Some(kind), None) => kind,
        (None, None) => CompressorKind::FlCs,
        (None, Some(scheme)) => match scheme {
            Scheme::Std => CompressorKind::Identity,
            Scheme::Rnd => CompressorKind::FlRnd,
            Scheme::Freq => CompressorKind::FlFreq,
            Scheme::Cs => CompressorKind::FlCs,
        },
        // The older form of DGC and PowerSGD: `--scheme std --compressor dgc`.
        (Some(kind), Some(Scheme::Std)) if !kind.is_sketch() => kind,
        (Some(kind), Some(scheme)) => {
            return Err(Error::bad_value(
                "--scheme",
                format!(
                    "{}: the deprecated spelling of --compressor, given with --compressor {kind}: give --compressor alone",
                    format!("{scheme:?}").to_lowercase()
                ),
            )
            .into())
        }
    };
    let mut ignored: Vec<&str> = Vec::new();
    let rate = match (args.rate, args.ratio) {
        (Some(_), Some(_)) => {
            return Err(Error::bad_value(
                "--ratio",
                "the deprecated form of --rate (rate = 1 / ratio): give --rate alone",
            )
            .into())
        }
        (Some(rate), None) => rate,
        (None, Some(r)) if kind.is_sketch() => {
            if !(r > 0.0 && r <= 1.0) {
                return Err(
                    Error::bad_value("--ratio", format!("{r}: expected 0 < r <= 1")).into(),
                );
            }
            1.0 / r
        }
        (None, Some(_)) => {
            ignored.push("--ratio");
            1.0
        }
        (None, None) if kind.is_sketch() => dpcomp::fl::DEFAULT_SKETCH_RATE,
        (None, None) => 1.0,
    };
    let mut options = args.compressor_options.clone();
    let mut legacy_option =
        |flag: &'static str, applies: bool, option: Option<(&str, toml::Value)>| match (
            option, applies,
        ) {
            (Some((key, value)), true) => options.push(dpcomp::compress::Setting {
                key: key.to_string(),
                value,
            }),
            (Some(_), false) => ignored.push(flag),
            (None, _) => {}
        };
    let freq_or_cs = matches!(kind, CompressorKind::FlFreq | CompressorKind::FlCs);
    let cs = kind == CompressorKind::FlCs;
    legacy_option(
        "--chunks",
        freq_or_cs,
        args.chunks.map(|p| ("chunks", p.into())),
    );
    match args.rows {
        Some(DctRows::Random) if kind == CompressorKind::FlFreq => {
            return Err(Error::bad_value(
                "--rows",
                "random: FL-FREQ keeps the first DCT rows; random rows are FL-CS's",
            )
            .into())
        }
        Some(DctRows::Random) => legacy_option("--rows", cs, Some(("rows", "random".into()))),
        Some(DctRows::First) | None => {}
    }
    legacy_option("--lambda", cs, args.lambda.map(|l| ("lambda", l.into())));
    legacy_option(
        "--owlqn-iterations",
        cs,
        args.owlqn_iterations
            .map(|i| ("iterations", (i as i64).into())),
    );
    let compression = dpcomp::config::CompressionSettings::from_flags(
        kind,
        Some(rate),
        Some(args.rank),
        options.clone(),
    )?;
    let deprecated: Vec<&str> = [
        ("--scheme", args.scheme.is_some()),
        ("--ratio", args.ratio.is_some()),
        ("--chunks", args.chunks.is_some()),
        ("--rows", args.rows.is_some()),
        ("--lambda", args.lambda.is_some()),
        ("--owlqn-iterations", args.owlqn_iterations.is_some()),
    ]
    .into_iter()
    .filter(|(_, given)| *given)
    .map(|(flag, _)| flag)
    .collect();
    let warning = (!deprecated.is_empty()).then(|| {
        let mut new_form = format!("--compressor {kind}");
        if rate != 1.0 {
            new_form.push_str(&format!(" --rate {rate}"));
        }
        for option in &options {
            new_form.push_str(&format!(" --compressor-option {option}"));
        }
        let ignored = if ignored.is_empty() {
            String::new()
        } else {
            format!(
                " ({} ignored by {kind}, as before)",
                ignored.join(", ")
            )
        };
        format!(
            "{} deprecated and will be removed in the next release; `dpcomp fl` takes the compressor as `dpcomp train` does: {new_form}{ignored}",
            if deprecated.len() == 1 {
                format!("{} is", deprecated[0])
            } else {
                format!("{} are", deprecated.join(", "))
            }
        )
    });
    Ok((compression, warning))
}

/// The settings `dpcomp fl` runs with: the dataset's defaults, overridden by the flags, and σ
/// calibrated when --target-epsilon is given. The older compressor flags' deprecation warning
/// is printed here (`fl_compression`).
pub fn fl_settings(args: &FlArgs) -> Result<dpcomp::fl::FlSettings> {
    use dpcomp::fl::{default_clip, default_full_clip, FlPrivacy, FlSettings};
    let mut s = FlSettings::defaults(args.dataset);
    let (compression, warning) = fl_compression(args)?;
    if let Some(warning) = warning {
        log::warn!("{warning}");
    }
    s.compression = compression;
    s.model = args.model;
    s.validation = args.validation;
    s.clients = args.clients.unwrap_or(s.clients);
    s.fraction = args.fraction.unwrap_or(s.fraction);
    s.local.steps = args.local_steps.unwrap_or(s.local.steps);
    s.local.batch = args.local_batch.unwrap_or(s.local.batch);
    s.local.learning_rate = args.local_lr.unwrap_or(s.local.learning_rate);
    s.rounds = args.rounds.unwrap_or(s.rounds);
    s.patience = args.patience;
    s.partition = dpcomp::data::partition::Partition::parse(&args.non_iid)?;
    s.server_learning_rate = args.server_lr;
    s.server_momentum = args.server_momentum;
    s.eval_examples = args.eval_examples;
    s.seed = args.seed;
    s.device = args.device;
    if args.dp {
        let noise_multiplier = match (args.noise_multiplier, args.target_epsilon) {
            (Some(sigma), None) => sigma,
            (None, Some(target)) => privacy::calibrate::noise_multiplier_for(
                args.accountant,
                target,
                s.fraction,
                s.rounds as u64,
                args.delta,
            )?,
            _ => {
                return Err(Error::bad_value(
                    "--dp",
                    "expected --target-epsilon E or --noise-multiplier SIGMA",
                )
                .into())
            }
        };
        if let Some(full) = args.full_clip.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(Error::bad_value(
                "--full-clip",
                format!("{full}: expected a finite clip radius > 0"),
            )
            .into());
        }
        let full = args.full_clip.unwrap_or(default_full_clip(args.dataset));
        s.privacy = Some(FlPrivacy {
            clip: args
                .clip
                .unwrap_or(default_clip(full, s.scheme(), s.compression.rate())),
            noise_multiplier,
            delta: args.delta,
            accountant: args.accountant,
        });
    } else if args.target_epsilon.is_some() || args.noise_multiplier.is_some() {
        return Err(
            Error::bad_value("--target-epsilon/--noise-multiplier", "only with --dp").into(),
        );
    }
    s.validate()?;
    Ok(s)
}

pub fn run(args: FlArgs) -> Result<()> {
    let settings = fl_settings(&args)?;
    let data_dir = data::data_dir(args.data_dir.as_deref());
    let fl_data = dpcomp::fl::data::FlData::load(settings.dataset, &data_dir)?;
    if let (true, Some(out)) = (args.restart, &args.out) {
        dpcomp::fl::clear_run(out)?;
    }
    let canaries = args
        .audit_canaries
        .map(|m| dpcomp::privacy::canary::CanarySettings {
            canaries: m,
            dense: args.audit_dense,
            observe: dpcomp::privacy::canary::Observe::Final,
            seed: args.audit_seed,
        });
    let mut run = dpcomp::fl::FederatedRun::builder()
        .settings(settings.clone())
        .data(&fl_data);
    if let Some(out) = &args.out {
        run = run.out(out);
    }
    if let Some(canaries) = canaries {
        run = run.canaries(canaries);
    }
    if !args.json {
        run = run.observer(Box::new(dpcomp::fl::observer::ProgressBars::new()?));
    }
    let outcome = run.build()?.run()?;
    let summary = outcome
        .summary
        .context("a federated run without a round to stop after ends with its summary")?;
    let scores = outcome.canary_scores;
    let audit = match (scores, settings.privacy) {
        (Some(scores), Some(p)) => {
            let m = scores.included.len();
            let guesses = dpcomp::privacy::audit::Guesses {
                included: args.audit_guesses.unwrap_or((m / 10).max(1)),
                excluded: 0,
            };
            let accounted = summary.epsilon.unwrap_or(f64::INFINITY);
            let audit = dpcomp::privacy::audit::CanaryAudit::of(
                &scores, guesses, p.delta, 0.05, accounted,
            )?;
            if let Some(dir) = &args.out {
                let path = dir.join("audit.json");
                std::fs::write(&path, serde_json::to_string_pretty(&audit)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Some(audit)
        }
        _ => None,
    };
    if args.json {
        match &audit {
            Some(audit) => println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"summary": summary, "audit": audit})
                )?
            ),
            None => println!("{}", serde_json::to_string_pretty(&summary)?),
        }
        return Ok(());
    }
    if let Some(a) = &audit {
        println!(
            "audit: {} canary clients ({} included, sampled {} times): audited epsilon {:.4} every round ({}/{} right), {:.4} final weights ({}/{}), at most {:.3}, at 95% confidence; accounted {:.4}{}",
            a.every_step.canaries,
            a.every_step.included,
            a.canary_samples,
            a.every_step.epsilon_lower_bound,
            a.every_step.correct,
            a.every_step.guesses,
            a.final_weights.epsilon_lower_bound,
            a.final_weights.correct,
            a.final_weights.guesses,
            a.max_bound,
            a.accounted_epsilon,
            if a.flagged { " -- FLAGGED" } else { "" }
        );
    }
    println!(
        "{} on {}: n {}, m {} (r {:.4}{}), {} clients, C {}, {} rounds{}",
        summary.scheme,
        summary.dataset,
        summary.parameters,
        summary.message_length,
        summary.ratio,
        summary.chunks.map_or(String::new(), |p| format!(", P {p}")),
        summary.clients,
        summary.fraction,
        summary.rounds_run,
        if summary.stopped_early {
            " (stopped early)"
        } else {
            ""
        }
    );
    if let (Some(s), Some(sigma), Some(eps), Some(delta)) = (
        summary.clip,
        summary.noise_multiplier,
        summary.epsilon,
        summary.delta,
    ) {
        println!(
            "client-level DP: S {s:.4}, sigma {sigma:.4}, epsilon {eps:.4} at delta {delta:e}"
        );
    }
    println!(
        "best {} {:.4} at round {} (accuracy {:.4}{}), cost {:.2} kB (r n 32 round C)",
        summary.metric,
        summary.best,
        summary.best_round,
        summary.accuracy_at_best,
        summary
            .auroc_at_best
            .map_or(String::new(), |a| format!(", AUROC {a:.4}")),
        summary.cost_bits / 8e3
    );
    println!(
        "mean seconds a round: clients {:.3}, server {:.3}; wall {:.1} s",
        summary.mean_client_seconds, summary.mean_server_seconds, summary.wall_seconds
    );
    Ok(())
}
