//! Issue 37, proven on the CPU: a training step reads no tensor value to the host and runs no
//! op whose result's size depends on the data, so on CUDA it queues work without waiting for
//! the device. The library reads values only through `dpcomp::host`, which counts every read
//! on the calling thread; these tests train with every compressor and mode and count the reads
//! each step made, from an observer's `step_finished` to the next (the epoch's end, where the
//! results are read, falls outside; the observer's `interval` is 0, so nothing is logged during
//! the epoch). The sequences' widths, which stay in host memory on every device, are read
//! uncounted (`host::cpu_i64_scalar`). A second test keeps every read in `src/` going through
//! the counter.

use crate::common;
use common::require_shared_data;
use dpcomp::compress::CompressorKind;
use dpcomp::config::{ClippingMode, DeviceChoice, GradSampleMode, OptimizerKind, TrainConfig};
use dpcomp::host;
use dpcomp::train::observer::Observer;
use dpcomp_lab::Task;
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

/// The host reads of each step: the counter at `step_finished` minus the counter at the
/// previous step's end (or the epoch's start).
struct StepReads {
    per_step: Rc<RefCell<Vec<u64>>>,
    last: u64,
}

impl Observer for StepReads {
    fn epoch_started(&mut self, _epoch: usize, _epochs: usize, _steps: usize) {
        self.last = host::reads();
    }

    fn step_finished(&mut self, _epoch: usize, _step: usize) {
        let now = host::reads();
        self.per_step.borrow_mut().push(now - self.last);
        self.last = now;
    }
}

/// Trains `config` for its epochs and returns the host reads of every step, as the observer
/// counted them; checks that the run's own count (`host_reads_per_step` in its metrics) is
/// their mean.
fn reads_per_step(config: TrainConfig) -> Vec<u64> {
    // The trainer seeds LibTorch's generator: no other test of this file draws meanwhile.
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let per_step = Rc::new(RefCell::new(Vec::new()));
    let observer = StepReads {
        per_step: per_step.clone(),
        last: 0,
    };
    let mut trainer = dpcomp_lab::tasks::trainer(dir.path())
        .config(config)
        .observer(Box::new(observer))
        .build()
        .unwrap();
    trainer.run().unwrap();
    let steps = per_step.borrow().clone();
    let logged: Vec<f64> = trainer
        .history()
        .iter()
        .map(|m| {
            m.host_reads_per_step
                .expect("every epoch logs its host reads")
        })
        .collect();
    let counted = steps.iter().sum::<u64>() as f64 / steps.len().max(1) as f64;
    assert_eq!(logged.len(), 1, "one epoch");
    assert!(
        (logged[0] - counted).abs() < 1e-12,
        "metrics say {} host reads per step, the observer counted {counted}",
        logged[0]
    );
    steps
}

/// One setting of a run: its label and what it changes in the base configuration.
type Variant = (&'static str, fn(&mut TrainConfig));

fn compressed(c: &mut TrainConfig, kind: CompressorKind, rate: f64, options: &[&str]) {
    let options = dpcomp::compress::Setting::parse_all(options).unwrap();
    c.compression =
        dpcomp::config::CompressionSettings::from_flags(kind, Some(rate), None, options).unwrap();
}

/// Every compressor under DP (DGC and Denoise on their CUDA path, `topk=exact`), the
/// non-private step, physical batches, per-layer, adaptive and two-pass clipping, DP-Adam and
/// the second clipping. FL-CS is the known exception: its OWL-QN reconstruction stops early on
/// a value it reads (`compress::owlqn`).
const VARIANTS: [Variant; 19] = [
    ("dp identity", |_| {}),
    ("dp dgc exact", |c| {
        compressed(c, CompressorKind::Dgc, 16.0, &["topk=exact"])
    }),
    ("dp dgc exact model-wise", |c| {
        compressed(c, CompressorKind::Dgc, 16.0, &["topk=exact", "scope=model"])
    }),
    ("dp powersgd", |c| {
        compressed(c, CompressorKind::Powersgd, 1.0, &["rank=1"]);
    }),
    ("dp powersgd fresh q", |c| {
        compressed(
            c,
            CompressorKind::Powersgd,
            1.0,
            &["rank=2", "warm_start=false"],
        );
    }),
    ("dp denoise exact", |c| {
        compressed(c, CompressorKind::Denoise, 16.0, &["topk=exact"])
    }),
    ("dp fl-rnd", |c| {
        compressed(c, CompressorKind::FlRnd, 10.0, &[])
    }),
    ("dp fl-freq", |c| {
        compressed(c, CompressorKind::FlFreq, 10.0, &[])
    }),
    // Issue 40's families; threshold-v's and Elias gamma's sizes stay on the device.
    ("dp qsgd elias", |c| {
        compressed(c, CompressorKind::Qsgd, 1.0, &["encoding=elias"])
    }),
    ("dp terngrad and signs", |c| {
        compressed(c, CompressorKind::Terngrad, 1.0, &[])
    }),
    ("dp ef-signsgd", |c| {
        compressed(c, CompressorKind::EfSignsgd, 1.0, &[])
    }),
    ("dp randomk", |c| {
        compressed(c, CompressorKind::Randomk, 16.0, &[])
    }),
    ("dp threshold", |c| {
        compressed(c, CompressorKind::Threshold, 1.0, &["threshold=0.05"])
    }),
    ("non-private dgc exact", |c| {
        c.privacy.noise_multiplier = None;
        compressed(c, CompressorKind::Dgc, 16.0, &["topk=exact"]);
    }),
    ("dp physical batches", |c| {
        c.privacy.physical_batch_size = Some(3)
    }),
    ("dp per-layer", |c| {
        c.privacy.clipping = ClippingMode::PerLayer
    }),
    ("dp adaptive", |c| {
        c.privacy.clipping = ClippingMode::Adaptive;
        c.privacy.count_noise = Some(1.0);
    }),
    ("dp two-pass adam", |c| {
        c.privacy.grad_sample = GradSampleMode::TwoPass;
        c.optimizer.kind = OptimizerKind::Adam;
        c.optimizer.lr = 0.01;
    }),
    ("dp clip noised", |c| c.compression.clip_noised = Some(1.0)),
];

/// The variants named `labels`.
fn only(labels: &[&str]) -> Vec<Variant> {
    let chosen: Vec<Variant> = VARIANTS
        .into_iter()
        .filter(|(label, _)| labels.contains(label))
        .collect();
    assert_eq!(chosen.len(), labels.len(), "{labels:?}");
    chosen
}

/// A private one-epoch run of `task` on `train` examples at (expected) batch `batch`, about
/// `train / batch` Poisson steps, on the CPU.
fn base(task: Task, data: &Path, train: usize, batch: usize) -> TrainConfig {
    let mut c = dpcomp_lab::tasks::paper_defaults(task);
    c.model.bert_dir = common::bert_dir();
    c.epochs = 1;
    c.seed = 3;
    c.device = DeviceChoice::Cpu;
    c.data.data_dir = Some(data.to_path_buf());
    c.data.limit_train = Some(train);
    c.data.limit_test = Some(16);
    c.optimizer.batch_size = batch;
    c.privacy.noise_multiplier = Some(1.0);
    c
}

/// Every variant of `task` takes its steps (at least `steps` of them, `train / batch` on
/// average) without a host read.
fn no_reads_in_any_step(
    task: Task,
    (data, train, batch): (&Path, usize, usize),
    variants: &[Variant],
    steps: usize,
) {
    let mut failures = Vec::new();
    for (label, change) in variants {
        let mut c = base(task, data, train, batch);
        change(&mut c);
        let reads = reads_per_step(c);
        assert!(
            reads.len() >= steps,
            "{task:?} {label}: {} steps",
            reads.len()
        );
        let total: u64 = reads.iter().sum();
        if total > 0 {
            failures.push(format!(
                "{task:?} {label}: {total} host reads in {} steps ({reads:?})",
                reads.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn surnames_steps_read_nothing_to_the_host() {
    let Some(data) = require_shared_data() else {
        return;
    };
    no_reads_in_any_step(Task::Surnames, (&data, 240, 8), &VARIANTS, 20);
}

#[test]
fn cifar10_steps_read_nothing_to_the_host() {
    let Some(data) = common::require_cifar10() else {
        return;
    };
    no_reads_in_any_step(Task::Cifar10, (&data, 240, 8), &VARIANTS, 20);
}

/// BERT (embeddings, layer norms, attention) on SNLI: the layers' private step in its modes
/// (the compressors, model-agnostic, are covered above; on BERT's 22M parameters each takes
/// seconds a step on the CPU).
#[test]
fn snli_bert_steps_read_nothing_to_the_host() {
    let Some(data) = common::require_snli() else {
        return;
    };
    let variants = only(&["dp identity", "dp physical batches", "dp two-pass adam"]);
    no_reads_in_any_step(Task::Snli, (&data, 24, 4), &variants, 6);
}

/// ResNet-18 (group norms, residual blocks) on tiny CIFAR-100 files: about 4 s a private step
/// on two CPU cores, so three steps of the private step with DGC on its CUDA path.
#[test]
fn resnet18_steps_read_nothing_to_the_host() {
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_cifar100(dir.path(), 24, 4);
    let variants = only(&["dp dgc exact"]);
    no_reads_in_any_step(Task::Cifar100, (dir.path(), 24, 8), &variants, 3);
}

/// The counter sees what it should: DGC's sampled threshold selects among the elements above
/// it, a data-dependent size (`host::nonzero`), once per sampled layer per step, on the
/// CIFAR-10 CNN, whose large layers are sampled. It is the CPU's default (`topk=auto`); on
/// CUDA the default is the exact selection, which the tests above run (`topk=exact`).
#[test]
fn the_sampled_top_k_counts_its_reads() {
    use dpcomp::compress::topk::TopK;
    assert_eq!(
        TopK::DEFAULT.on(tch::Device::Cpu),
        TopK::Sampled { ratio: 0.01 }
    );
    assert_eq!(TopK::DEFAULT.on(tch::Device::Cuda(0)), TopK::Exact);
    let Some(data) = common::require_cifar10() else {
        return;
    };
    for options in [&["topk=sampled"][..], &[]] {
        let mut c = base(Task::Cifar10, &data, 80, 8);
        compressed(&mut c, CompressorKind::Dgc, 16.0, options);
        let reads = reads_per_step(c);
        assert!(reads.len() >= 5, "{options:?}: {} steps", reads.len());
        assert!(reads.iter().all(|&r| r >= 1), "{options:?}: {reads:?}");
    }
}

// ---- The guard: every read in `src/` goes through `dpcomp::host`. ----

/// What reads a tensor's value to the host or has a data-dependent size, and what to call
/// instead.
const DIRECT: [(&str, &str); 14] = [
    ("double_value(", "host::f64_scalar / host::f64_at"),
    ("int64_value(", "host::i64_scalar"),
    ("f64_value(", "host::f64_scalar"),
    ("copy_data", "host::to_bytes"),
    (".equal(", "host::equal"),
    (
        ".allclose(",
        "host::equal or a tolerance read through host::f64_scalar",
    ),
    (".is_nonzero(", "host::bool_scalar"),
    (".nonzero(", "host::nonzero"),
    (".nonzero_numpy(", "host::nonzero"),
    (".argwhere(", "host::nonzero"),
    (
        "where_(",
        "host::nonzero (the one-argument where is nonzero)",
    ),
    (".masked_select(", "host::masked_select"),
    (
        ".unique",
        "a host function of its own in crates/dpcomp/src/host.rs",
    ),
    (
        ".repeat_interleave",
        "a host function of its own in crates/dpcomp/src/host.rs",
    ),
];

/// The offending call in one line of code, and what to use instead; `None` when the line reads
/// nothing directly. `T::try_from(..)` is a tensor read when T is `Vec`, `bool` or a float, or
/// an integer converted from a reference (`i64::try_from(&t)`; `u32::try_from(n)` is not).
fn direct_read(code: &str) -> Option<(&'static str, &'static str)> {
    if let Some(found) = DIRECT.iter().find(|(pattern, _)| code.contains(pattern)) {
        return Some(*found);
    }
    let mut rest = code;
    while let Some(at) = rest.find("::try_from(") {
        let target = rest[..at]
            .rsplit(|c: char| !(c.is_alphanumeric() || "_<>:".contains(c)))
            .next()
            .unwrap_or("");
        let argument = &rest[at + "::try_from(".len()..];
        let by_reference = argument.starts_with('&');
        let integer = ["i64", "i32", "i16", "i8", "u8"].contains(&target);
        if target.starts_with("Vec")
            || ["bool", "f64", "f32", "half"].contains(&target)
            || (integer && by_reference)
        {
            return Some(("T::try_from(&tensor)", "host::to_vec_* or host::*_scalar"));
        }
        rest = argument;
    }
    None
}

#[test]
fn the_guard_knows_a_read_from_other_conversions() {
    for read in [
        "let x = t.double_value(&[]);",
        "let n = t.sum(Kind::Int64).int64_value(&[]);",
        "let v = Vec::<f32>::try_from(&flat)?;",
        "let v: Vec<i64> = Vec::try_from(&t)?;",
        "let b = bool::try_from(t.isfinite().all());",
        "let x = f64::try_from(t)?;",
        "let n = i64::try_from(&count)?;",
        "let i = mask.nonzero();",
        "let i = Tensor::where_(&mask);",
        "let kept = x.masked_select(&mask);",
        "p.copy_data_u8(&mut bytes, n);",
        "assert!(a.equal(&b));",
        "let (values, _, _) = x.unique_dim(0, true, false, false);",
    ] {
        assert!(direct_read(read).is_some(), "not caught: {read}");
    }
    for fine in [
        "let n = u32::try_from(bytes.len()).map_err(bad)?;",
        "let step = i64::try_from(step).unwrap();",
        "let c = Count::try_from(bytes.len());",
        "let x = crate::host::f64_scalar(&t.sum(Kind::Double));",
        "let v = host::to_vec_f32(&flat)?;",
        "let y = x.where_self(&mask, &z);",
        "let t = toml::Value::try_from(self);",
    ] {
        assert_eq!(direct_read(fine), None, "wrongly caught: {fine}");
    }
}

/// Every `.rs` file of the framework and the lab (`crates/*/src/`) but `crates/dpcomp/src/host.rs`
/// reads tensor values only through `dpcomp::host`, so that the count of `host::reads` is complete.
/// Comment lines (and the documentation's examples in them) are not code of the library.
#[test]
fn every_read_in_the_library_goes_through_the_host_module() {
    let files = crate::common::library_rust_files();
    assert!(files.len() > 50, "found only {} library files", files.len());
    let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/dpcomp/src/host.rs");
    let mut offending = Vec::new();
    for file in files.iter().filter(|f| **f != host) {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if let Some((pattern, instead)) = direct_read(code) {
                offending.push(format!(
                    "{}:{}: {pattern} (use {instead}): {}",
                    file.strip_prefix(env!("CARGO_MANIFEST_DIR"))
                        .unwrap()
                        .display(),
                    i + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "tensor values read outside dpcomp::host:\n{}",
        offending.join("\n")
    );
}

/// W = 2 data-parallel workers as threads of one process (`comm::ThreadGroup`, what
/// `--thread-workers 2` runs), each thread counted on its own: the step reads nothing but the
/// exchange's transfers to the transport, one per collective however many tensors a message
/// has (`host::one_transfer`: the transport moves bytes in host memory, MPI's as the thread
/// transport that is its reference, so the message comes to the host with one wait): one for a
/// dense all-reduce, one for DGC's gathered message (before: one per tensor of the message, 14
/// on the Surnames LSTM), two for PowerSGD's P and Q.
#[test]
fn two_thread_workers_read_only_their_exchanges_transfers() {
    let Some(data) = require_shared_data() else {
        return;
    };
    let mut failures = Vec::new();
    for ((label, change), transfers) in only(&["dp identity", "dp dgc exact", "dp powersgd"])
        .into_iter()
        .zip([1u64, 1, 2])
    {
        let mut c = base(Task::Surnames, &data, 240, 8);
        change(&mut c);
        c.privacy.local_noise = true; // DGC's messages are gathered: each carries all the noise
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        // Both ranks seed LibTorch's generator and must build the same weights.
        let _serial = common::serial();
        let per_rank = dpcomp::comm::ThreadGroup::run(2, move |comm| {
            let per_step = Rc::new(RefCell::new(Vec::new()));
            let observer = StepReads {
                per_step: per_step.clone(),
                last: 0,
            };
            let mut trainer = dpcomp_lab::tasks::trainer(&run)
                .config(c.clone())
                .communicator(Box::new(comm))
                .observer(Box::new(observer))
                .build()
                .unwrap();
            trainer.run().unwrap();
            let steps = per_step.borrow().clone();
            steps
        })
        .unwrap();
        for (rank, reads) in per_rank.iter().enumerate() {
            assert!(
                reads.len() >= 20,
                "{label} rank {rank}: {} steps",
                reads.len()
            );
            if reads.iter().any(|&r| r != transfers) {
                failures.push(format!(
                    "{label}, rank {rank} of 2: expected {transfers} host read(s) a step, its transfers to the transport; counted {reads:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
