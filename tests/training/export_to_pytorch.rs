//! Weights exported as docs/guide/library.md ("Exporting weights to PyTorch") documents load
//! into the equivalent PyTorch module with `load_state_dict(strict=True)` and give the same
//! logits: `checkpoint::save_weights` writes the model's store to safetensors, the `.venv`'s
//! Python (torch and the `safetensors` package, `scripts/setup.sh`) loads the file into the
//! modules of `tests/fixtures/export_to_pytorch.py` and runs the same fixed input, and the two
//! sets of logits agree within 1e-5. A file with one key renamed is refused by the same strict
//! load, naming the key on both sides, so the agreement is not that of a lenient load.
//!
//! Without the `.venv` or the `safetensors` package the tests say they skip (a failure on CI,
//! which runs `scripts/setup.sh`).

use crate::common;
use dpcomp::data::Features;
use dpcomp::models::Model;
use dpcomp::nn::Ctx;
use dpcomp::train::checkpoint::save_weights;
use dpcomp_lab::Task;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tch::{Device, Kind, Tensor};

/// The largest difference allowed between dpcomp's and PyTorch's logits in float32 (the
/// exported weights as they are; the two libraries round in different orders).
const TOLERANCE: f64 = 1e-5;

/// The same in float64 (both sides widen the same float32 weights): only a difference in what
/// the weights mean would show here.
const TOLERANCE_DOUBLE: f64 = 1e-10;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.venv`'s Python when it imports torch and safetensors; a skip otherwise.
fn python() -> Option<PathBuf> {
    let python = root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(".venv/bin/python missing: run scripts/setup.sh");
        return None;
    }
    let probe = Command::new(&python)
        .args(["-c", "import torch, safetensors.torch"])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    if !probe.status.success() {
        common::skip(&format!(
            "the .venv's Python cannot import torch and safetensors (run scripts/setup.sh, which installs safetensors): {}",
            String::from_utf8_lossy(&probe.stderr)
                .lines()
                .last()
                .unwrap_or("no message")
        ));
        return None;
    }
    Some(python)
}

/// Runs `tests/fixtures/export_to_pytorch.py` on `model` (`surnames` or `cifar_cnn`) with
/// `classes` classes, the weights file and the inputs file, writing PyTorch's logits to `out`.
fn run_pytorch(
    python: &Path,
    model: &str,
    classes: i64,
    weights: &Path,
    inputs: &Path,
    out: &Path,
) -> Output {
    Command::new(python)
        .arg(root().join("tests/fixtures/export_to_pytorch.py"))
        .args([model, &classes.to_string()])
        .args([weights, inputs, out])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()))
}

/// Exports `model` with `save_weights`, runs the PyTorch module on `inputs` (named tensors, as
/// the script reads them), and checks PyTorch's logits against dpcomp's (`forward`, given the
/// floating-point kind of the weights and inputs): within [`TOLERANCE`] in float32, as exported,
/// and within [`TOLERANCE_DOUBLE`] once both sides compute in float64 (the same weights, widened).
/// Then a copy of the file with `renamed` renamed is refused by the strict load, naming the key
/// it lacks and the one it did not expect. `model` computes in float64 afterwards.
fn check_export(
    python: &Path,
    name: &str,
    model: &dyn Model,
    classes: i64,
    inputs: &[(&str, Tensor)],
    forward: &dyn Fn(Kind) -> Tensor,
    renamed: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("model.safetensors");
    save_weights(model.var_store(), &weights).unwrap();
    let inputs_file = dir.path().join("inputs.safetensors");
    Tensor::write_safetensors(inputs, &inputs_file).unwrap();

    let out = dir.path().join("logits.safetensors");
    let ran = run_pytorch(python, name, classes, &weights, &inputs_file, &out);
    assert!(
        ran.status.success(),
        "{name}: PyTorch did not load the exported weights with strict=True:\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let theirs = Tensor::read_safetensors(&out).unwrap();
    let theirs = |key: &str| {
        theirs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| t.shallow_clone())
            .unwrap_or_else(|| panic!("{name}: no {key} in PyTorch's output"))
    };
    let logits = forward(Kind::Float);
    // The logits are no constant that any weights would give: they vary over the examples.
    let spread = (&logits - logits.mean(Kind::Float))
        .abs()
        .max()
        .double_value(&[]);
    assert!(spread > 1e-3, "{name}: logits all about equal ({spread:e})");
    common::to_double(model.var_store());
    let logits_double = forward(Kind::Double);
    for (key, ours, kind, tolerance) in [
        ("logits", logits, Kind::Float, TOLERANCE),
        (
            "logits_double",
            logits_double,
            Kind::Double,
            TOLERANCE_DOUBLE,
        ),
    ] {
        let theirs = theirs(key);
        assert_eq!(theirs.kind(), kind, "{name}: {key}' kind");
        assert_eq!(ours.kind(), kind, "{name}: dpcomp's {key}' kind");
        assert_eq!(theirs.size(), ours.size(), "{name}: {key}' shapes");
        let gap = (&theirs - &ours).abs().max().double_value(&[]);
        eprintln!("{name}: largest |PyTorch - dpcomp| over the {key} {gap:e}");
        assert!(
            gap <= tolerance,
            "{name}: PyTorch's {key} differ from dpcomp's by up to {gap:e} (tolerance {tolerance:e})"
        );
    }

    // The same file with one tensor under another name (a Rust path named otherwise than the
    // PyTorch attribute): the strict load refuses it, naming both keys.
    let mut tensors = Tensor::read_safetensors(&weights).unwrap();
    let wrong = format!("{renamed}s");
    let entry = tensors
        .iter_mut()
        .find(|(key, _)| key == renamed)
        .unwrap_or_else(|| panic!("{name}: no {renamed} in the exported file"));
    entry.0 = wrong.clone();
    let misnamed = dir.path().join("misnamed.safetensors");
    Tensor::write_safetensors(&tensors, &misnamed).unwrap();
    let refused = run_pytorch(
        python,
        name,
        classes,
        &misnamed,
        &inputs_file,
        &dir.path().join("unused.safetensors"),
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "{name}: a file with {renamed} renamed {wrong} loaded with strict=True"
    );
    for expected in [
        format!("Missing key(s) in state_dict: \"{renamed}\""),
        format!("Unexpected key(s) in state_dict: \"{wrong}\""),
    ] {
        assert!(
            stderr.contains(&expected),
            "{name}: no {expected:?} in:\n{stderr}"
        );
    }
}

/// The Surnames LSTM after a short private training (embedding, LSTM and classifier weights
/// moved by DP-SGD), on 32 test names of several lengths.
#[test]
fn a_trained_surnames_lstm_loads_strictly_into_pytorch_and_gives_the_same_logits() {
    let _serial = common::serial();
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let Some(python) = python() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let mut config = common::small_surnames(&data, 1, 256, 64);
    config.privacy.noise_multiplier = Some(1.0);
    let mut trainer = dpcomp_lab::tasks::start(config, work.path().join("run")).unwrap();
    trainer.run().unwrap();
    let classes = trainer.data().classes.len() as i64;
    let Features::Tokens { ids, lengths } = &trainer.data().test.features else {
        panic!("Surnames features are token sequences");
    };
    let (ids, lengths) = (ids.narrow(0, 0, 32), lengths.narrow(0, 0, 32));
    let widths = Vec::<i64>::try_from(&lengths).unwrap();
    assert!(
        widths.iter().min() < widths.iter().max(),
        "the names have several lengths: {widths:?}"
    );
    let model = trainer.model();
    let forward = |_: Kind| {
        let features = Features::Tokens {
            ids: ids.shallow_clone(),
            lengths: lengths.shallow_clone(),
        };
        tch::no_grad(|| model.forward(&features, &mut Ctx::eval())).unwrap()
    };
    assert_eq!(forward(Kind::Float).size(), [32, classes]);
    check_export(
        &python,
        "surnames",
        model,
        classes,
        &[
            ("ids", ids.shallow_clone()),
            ("lengths", lengths.shallow_clone()),
        ],
        &forward,
        "classifier.weight",
    );
}

/// The CIFAR-10 CNN (convolutions, parameter-free instance norms, pooling, three linear
/// layers), freshly built, on 4 random images.
#[test]
fn the_cifar_cnn_loads_strictly_into_pytorch_and_gives_the_same_logits() {
    let _serial = common::serial();
    let Some(python) = python() else {
        return;
    };
    tch::manual_seed(7);
    let model = dpcomp_lab::tasks::build_model(
        Task::Cifar10,
        10,
        Device::Cpu,
        Path::new(""),
        &dpcomp::hf::FineTuning::default(),
    )
    .unwrap();
    let images = common::Draws::new(7).randn(&[4, 3, 32, 32], Kind::Float);
    let forward = |kind: Kind| {
        let images = Features::Images(images.to_kind(kind));
        tch::no_grad(|| model.forward(&images, &mut Ctx::eval())).unwrap()
    };
    assert_eq!(forward(Kind::Float).size(), [4, 10]);
    check_export(
        &python,
        "cifar_cnn",
        model.as_ref(),
        10,
        &[("images", images.shallow_clone())],
        &forward,
        "block1.conv.weight",
    );
}
