//! The surname-classification set of the PyTorch char-RNN tutorial: a folder with one
//! `<Language>.txt` per class (UTF-8, one name per line). Names are folded to ASCII (NFD, combining
//! marks dropped, as the tutorial does) and encoded byte by byte into a 256-symbol set.

use super::{read_file, require_dir, Dataset, Features, TaskData};
use crate::error::{Error, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::Path;
use tch::Tensor;
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

/// Id 0 pads; it never occurs in a folded name.
pub const PAD: u8 = 0;
/// The number of symbols: byte values 0..256 (the Surnames model's embedding rows).
pub const VOCAB: i64 = 256;

/// NFD, then drop combining marks and anything still outside ASCII: "Ślusarski" -> "Slusarski".
pub fn fold_to_ascii(name: &str) -> String {
    name.nfd()
        .filter(|c| !is_combining_mark(*c) && c.is_ascii() && *c != '\0')
        .collect()
}

/// (surname, class index) pairs.
pub type LabelledNames = Vec<(String, i64)>;

/// One name per (non-empty) line of each `<Language>.txt`, classes in file-name order; returns
/// the labelled names and the class names.
pub fn read_names(dir: &Path) -> Result<(LabelledNames, Vec<String>)> {
    require_dir(dir, "the names folder with one <Language>.txt per class")?;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::bad_file(
            dir,
            "no <Language>.txt files in this folder",
        ));
    }
    let mut examples = Vec::new();
    let mut classes = Vec::new();
    for (label, path) in files.iter().enumerate() {
        let bytes = read_file(path)?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::bad_file(
                path,
                format!("not UTF-8 at byte {}", e.utf8_error().valid_up_to()),
            )
        })?;
        let before = examples.len();
        let mut truncated = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let mut name = fold_to_ascii(line.trim());
            if name.len() > MAX_NAME_LEN {
                // A batch is as wide as its longest name: one line of a megabyte would make
                // a batch need gigabytes of embeddings and LSTM activations.
                name.truncate(MAX_NAME_LEN);
                truncated.push(number + 1);
            }
            if !name.is_empty() {
                examples.push((name, label as i64));
            }
        }
        if let Some(first) = truncated.first() {
            log::warn!(
                "{}: {} name(s) longer than {MAX_NAME_LEN} characters truncated to it (first at line {first}); surnames are far shorter, so check the file",
                path.display(),
                truncated.len()
            );
        }
        if examples.len() == before {
            // A class without examples still takes a label and an output unit.
            log::warn!(
                "{}: no names; class {label} will have no examples",
                path.display()
            );
        }
        let class = path.file_stem().unwrap_or_default().to_string_lossy();
        classes.push(class.into_owned());
    }
    if classes.len() != OFFICIAL_CLASSES || examples.len() != OFFICIAL_NAMES {
        log::warn!(
            "{}: {} names in {} classes, the official data has {OFFICIAL_NAMES} in {OFFICIAL_CLASSES}",
            dir.display(),
            examples.len(),
            classes.len()
        );
    }
    Ok((examples, classes))
}

/// The PyTorch tutorial's `data/names` as `dpcomp data fetch` writes it: 18
/// languages, 20,050 names (the tutorial's zip has 20,074 lines; 24 junk lines in Russian.txt were
/// removed upstream, data/README.md).
pub(crate) const OFFICIAL_CLASSES: usize = 18;
pub(crate) const OFFICIAL_NAMES: usize = 20_050;

/// Padded byte ids [N, T] with T the longest name, and lengths \[N\].
pub fn encode(names: &[&str]) -> Features {
    let width = names.iter().map(|n| n.len()).max().unwrap_or(0);
    let mut ids = vec![PAD as i64; names.len() * width];
    for (row, name) in names.iter().enumerate() {
        for (col, byte) in name.bytes().enumerate() {
            ids[row * width + col] = byte as i64;
        }
    }
    let lengths: Vec<i64> = names.iter().map(|n| n.len() as i64).collect();
    Features::Tokens {
        ids: Tensor::from_slice(&ids).view([names.len() as i64, width as i64]),
        lengths: Tensor::from_slice(&lengths),
    }
}

fn dataset(examples: &[(String, i64)]) -> Dataset {
    let names: Vec<&str> = examples.iter().map(|(n, _)| n.as_str()).collect();
    let labels: Vec<i64> = examples.iter().map(|(_, l)| *l).collect();
    Dataset::new(encode(&names), Tensor::from_slice(&labels), None)
}

/// The longest name kept, in ASCII characters (the official data's longest has 20); longer
/// lines are cut to it with a warning naming the file and line.
pub const MAX_NAME_LEN: usize = 64;

/// Reads the `names` folder `dir` (one `<Language>.txt` per class) into Surnames' task data:
/// the names shuffled by `seed` and split 80/20 into train and test (deterministic per seed),
/// classes in file-name order. A missing folder or an unreadable file is an error naming it.
pub fn load(dir: &Path, seed: u64) -> Result<TaskData> {
    let (mut examples, classes) = read_names(dir)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    examples.shuffle(&mut rng);
    let n_train = examples.len() * 8 / 10;
    Ok(TaskData {
        train: dataset(&examples[..n_train]),
        test: dataset(&examples[n_train..]),
        classes,
    })
}
