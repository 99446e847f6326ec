//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The data folders a test may read, in order: $DPCOMP_DATA (which `scripts/setup.sh` sets on
/// the project's machines, where every data set is), then the crate's `data/` (the Surnames data
/// it ships, and what `scripts/setup.sh` installs there: breast cancer, flchain).
fn data_folders() -> Vec<PathBuf> {
    [
        std::env::var_os("DPCOMP_DATA").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The first data folder (`data_folders`) that has every one of `entries` (a data set's folder
/// or file, relative to the data folder).
pub fn data_holding(entries: &[&str]) -> Option<PathBuf> {
    data_folders()
        .into_iter()
        .find(|p| entries.iter().all(|e| p.join(e).exists()))
}

/// The data folder with the Surnames data, `names/`: the repository ships it in `data/names`,
/// so this is `None` only in a checkout that lost it.
pub fn shared_data() -> Option<PathBuf> {
    data_holding(&["names"])
}

/// The Surnames data, which every checkout has (`data/names`); a skip otherwise.
pub fn require_shared_data() -> Option<PathBuf> {
    require_data(
        &["names"],
        "no data folder with names/ (the repository ships data/names; see data/README.md)",
    )
}

/// A data folder with the Surnames data and the breast-cancer table, which `scripts/setup.sh`
/// extracts from the scikit-learn wheel into `data/breast_cancer/`; a skip where it has not run.
pub fn require_breast_cancer() -> Option<PathBuf> {
    require_data(
        &["names", "breast_cancer/breast_cancer.csv"],
        "no breast_cancer/breast_cancer.csv in the data folder (scripts/setup.sh extracts it from the scikit-learn wheel)",
    )
}

/// A data folder with the Surnames data and CIFAR-10 (`cifar-10-batches-bin/`, 184 MB, not
/// shipped: `dpcomp data fetch cifar10`, or `DPCOMP_DATA` naming a folder that has it); a skip
/// on a fresh clone.
pub fn require_cifar10() -> Option<PathBuf> {
    require_data(
        &["names", "cifar-10-batches-bin"],
        "CIFAR-10 (cifar-10-batches-bin/) is not in the data folder: a large download, not shipped (dpcomp data fetch cifar10, or set DPCOMP_DATA)",
    )
}

/// A data folder with the Surnames data and SNLI (`snli_1.0/`, not shipped: `dpcomp data fetch
/// snli`, or `DPCOMP_DATA`); a skip on a fresh clone.
pub fn require_snli() -> Option<PathBuf> {
    require_data(
        &["names", "snli_1.0"],
        "SNLI (snli_1.0/) is not in the data folder: a large download, not shipped (dpcomp data fetch snli, or set DPCOMP_DATA)",
    )
}

/// Whether the folder dpcomp reads by default (`dpcomp::data::data_dir(None)` from the crate's
/// folder: $DPCOMP_DATA, else `data/`) has `entry`, for tests of code that resolves the data
/// folder itself; a skip naming `what` otherwise.
pub fn require_in_default_data(entry: &str, what: &str) -> bool {
    let folder = std::env::var_os("DPCOMP_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data"));
    let found = folder.join(entry).exists();
    if !found {
        skip(&format!(
            "{what} ({entry}) is not in the data folder {}: not shipped (set DPCOMP_DATA, see data/README.md)",
            folder.display()
        ));
    }
    found
}

/// The first data folder with every one of `entries`; else a skip with `reason` (a failure on
/// CI, which has every data set).
pub fn require_data(entries: &[&str], reason: &str) -> Option<PathBuf> {
    let found = data_holding(entries);
    if found.is_none() {
        skip(reason);
    }
    found
}

/// Marks the calling test as skipped: an error on CI (which has every input), otherwise a line
/// written straight to the process's stderr, which the test harness does not capture, so that
/// `cargo test` shows the skip even for a test that "passes".
pub fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must not skip: {reason}"
    );
    announce_skip(reason);
}

/// The visible skip line alone, for inputs CI may legitimately lack (a Debian package that needs
/// root to install).
pub fn announce_skip(reason: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {reason}");
}

pub fn bert_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2")
}

/// Writes a CIFAR binary file: `records` of (label bytes, pixel fill byte).
pub fn write_cifar_file(path: &std::path::Path, records: &[(Vec<u8>, u8)]) {
    let mut bytes = Vec::new();
    for (labels, fill) in records {
        bytes.extend_from_slice(labels);
        bytes.extend(std::iter::repeat_n(*fill, 3072));
    }
    std::fs::write(path, bytes).unwrap();
}

/// Tiny CIFAR-100 files in the official layout under `root/cifar-100-binary` (coarse and fine
/// labels, one fill byte per image): `train` and `test` records.
pub fn write_tiny_cifar100(root: &std::path::Path, train: u8, test: u8) {
    let data = root.join("cifar-100-binary");
    std::fs::create_dir_all(&data).unwrap();
    let records = |n: u8| {
        (0..n)
            .map(|i| (vec![i % 20, i % 100], i.wrapping_mul(37)))
            .collect::<Vec<_>>()
    };
    write_cifar_file(&data.join("train.bin"), &records(train));
    write_cifar_file(&data.join("test.bin"), &records(test));
}

/// Converts every variable of `vs` to f64 in place (layers hold shallow handles to the same
/// tensors, so they compute in f64 afterwards).
pub fn to_double(vs: &tch::nn::VarStore) {
    for (_, mut p) in vs.variables() {
        tch::no_grad(|| {
            let double = p.to_kind(tch::Kind::Double);
            p.set_data(&double);
        });
    }
}

/// LibTorch's random generator is global to the process, and the tests of one file run in
/// parallel threads: tests whose result depends on the draws after a `manual_seed` (training,
/// noise) hold this lock so that no other test draws in between.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Seeded random tensors from a generator of the test's own, never LibTorch's global one: the
/// tests of a file run in parallel threads, and another test's `tch::manual_seed` or draw landing
/// between this test's seeding and drawing would change its data (and, near a tolerance, its
/// verdict) from run to run.
pub struct Draws(rand::rngs::StdRng);

impl Draws {
    pub fn new(seed: u64) -> Self {
        use rand::SeedableRng;
        Draws(rand::rngs::StdRng::seed_from_u64(seed))
    }

    /// N(0, 1) values of `shape`, on the CPU.
    pub fn randn(&mut self, shape: &[i64], kind: tch::Kind) -> tch::Tensor {
        self.tensor(shape, kind, |rng| {
            rand::Rng::sample(rng, rand_distr::StandardNormal)
        })
    }

    /// U[0, 1) values of `shape`, on the CPU.
    pub fn rand(&mut self, shape: &[i64], kind: tch::Kind) -> tch::Tensor {
        self.tensor(shape, kind, rand::Rng::random::<f64>)
    }

    fn tensor(
        &mut self,
        shape: &[i64],
        kind: tch::Kind,
        mut draw: impl FnMut(&mut rand::rngs::StdRng) -> f64,
    ) -> tch::Tensor {
        let count: i64 = shape.iter().product();
        let values: Vec<f64> = (0..count).map(|_| draw(&mut self.0)).collect();
        tch::Tensor::from_slice(&values).view(shape).to_kind(kind)
    }
}

/// A privacy engine at σ and sampling rate q whose `privatize` divides by `expected_batch`,
/// reporting ε at δ 1e-5 on the RDP accountant, for `parameters` trainable tensors: the builder
/// with the settings the engine's tests vary.
pub fn engine(
    sigma: f64,
    sample_rate: f64,
    expected_batch: f64,
    clipping: dpcomp::privacy::engine::Clipping,
    parameters: usize,
) -> dpcomp::error::Result<dpcomp::privacy::engine::PrivacyEngine> {
    dpcomp::privacy::engine::PrivacyEngine::builder()
        .noise_multiplier(sigma)
        .sample_rate(sample_rate)
        .expected_batch_size(expected_batch)
        .delta(1e-5)
        .clipping(clipping)
        .build(&vec![(); parameters])
}

/// The paper's Surnames settings on the first `train` / `test` examples of `data_dir` for
/// `epochs` epochs, on the CPU, not private: the small real training most tests start from.
pub fn small_surnames(
    data_dir: &std::path::Path,
    epochs: usize,
    train: usize,
    test: usize,
) -> dpcomp::config::TrainConfig {
    let mut c = dpcomp_lab::tasks::paper_defaults(dpcomp_lab::Task::Surnames);
    c.epochs = epochs;
    c.data.limit_train = Some(train);
    c.data.limit_test = Some(test);
    c.data.data_dir = Some(data_dir.to_path_buf());
    c.device = dpcomp::config::DeviceChoice::Cpu;
    c
}

/// `dpcomp <command> --help`'s text (the test fails naming the command if it does not run).
pub fn help(command: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(command)
        .arg("--help")
        .output()
        .expect("dpcomp runs");
    assert!(
        out.status.success(),
        "`dpcomp {} --help` failed: {}",
        command.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists under "Commands:", without clap's `help`.
pub fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// A checkpoint file's tensors (`<run>/checkpoint/<file>`), sorted by name, for comparing two
/// runs' checkpoints tensor by tensor.
pub fn checkpoint_tensors(run_dir: &std::path::Path, file: &str) -> Vec<(String, tch::Tensor)> {
    let path = run_dir.join("checkpoint").join(file);
    let mut named = tch::Tensor::read_safetensors(path).unwrap();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// A `metrics.jsonl` row without its timings, which no two runs share.
pub fn without_timings(mut row: serde_json::Value) -> serde_json::Value {
    for timing in ["wall_seconds", "examples_per_second", "epoch_seconds"] {
        row.as_object_mut().unwrap().remove(timing);
    }
    row
}

/// A run folder's `metrics.jsonl` rows (plain or packed), without their timings.
pub fn metrics_without_timings(run_dir: &std::path::Path) -> Vec<serde_json::Value> {
    dpcomp::run_log::read_rows(&run_dir.join("metrics.jsonl"), usize::MAX)
        .unwrap()
        .unwrap_or_else(|| panic!("{}: no metrics.jsonl", run_dir.display()))
        .into_iter()
        .map(without_timings)
        .collect()
}

/// Every `.rs` file of the framework and the lab (`crates/dpcomp/src`, `crates/dpcomp-lab/src`):
/// the library code the source guards read.
pub fn library_rust_files() -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let crates = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut files = Vec::new();
    walk(&crates.join("dpcomp/src"), &mut files);
    walk(&crates.join("dpcomp-lab/src"), &mut files);
    files
}

/// The project's Python (`scripts/setup.sh` makes `.venv`; torch, opacus, transformers and
/// peft are installed there).
pub fn venv_python() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python")
}

/// Tiny random Hugging Face checkpoints made offline by `transformers` (`scripts/hf_reference.py
/// make`: bert, roberta, gpt2, gpt2-cls, llama, llama-sharded, each a `save_pretrained` folder
/// with `reference.safetensors`: inputs and transformers' logits). Made once per version of the
/// script under `target/` (a folder named by the script's hash, written beside and renamed into
/// place, so that test binaries running at once agree) and reused.
pub fn hf_fixtures() -> PathBuf {
    use sha2::{Digest, Sha256};
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let script = root.join("scripts/hf_reference.py");
        let text = std::fs::read(&script).expect("scripts/hf_reference.py");
        let hash: String = Sha256::digest(&text)
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = root.join("target").join(format!("hf-fixtures-{hash}"));
        if dir.join("done").is_file() {
            return dir;
        }
        let tmp = root
            .join("target")
            .join(format!("hf-fixtures-{hash}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let output = std::process::Command::new(venv_python())
            .arg(&script)
            .args(["make", "--out"])
            .arg(&tmp)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .output()
            .expect("run .venv/bin/python (scripts/setup.sh makes it)");
        assert!(
            output.status.success(),
            "scripts/hf_reference.py make failed (transformers is installed by scripts/setup.sh): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::write(tmp.join("done"), b"").unwrap();
        if std::fs::rename(&tmp, &dir).is_err() {
            // Another test binary made it first.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        assert!(dir.join("done").is_file(), "{} was not made", dir.display());
        dir
    })
    .clone()
}
