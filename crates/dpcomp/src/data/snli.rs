//! SNLI 1.0 in its official jsonl layout (`gold_label`, `sentence1`, `sentence2` per line),
//! tokenised with the BERT model's own WordPiece vocabulary as `[CLS] a [SEP] b [SEP]` with segment
//! ids and an attention mask.
//!
//! Training uses `snli_1.0_train.jsonl` when the folder has it; otherwise (as in
//! the project machines' data folder, which has no train split) it trains on `snli_1.0_dev.jsonl` and says so.
//! Evaluation always uses `snli_1.0_test.jsonl`.

use super::{require_dir, Dataset, Features, TaskData};
use crate::error::{Error, Result};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use tch::Tensor;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{Tokenizer, TruncationParams, TruncationStrategy};

/// The three labels in label order: `TaskData::classes` and the model's logits follow it.
pub const CLASSES: [&str; 3] = ["entailment", "neutral", "contradiction"];

/// One labelled sentence pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// `sentence1`, the premise.
    pub premise: String,
    /// `sentence2`, the hypothesis.
    pub hypothesis: String,
    /// The gold label's index in [`CLASSES`].
    pub label: i64,
}

/// Reads a jsonl file; lines whose `gold_label` is "-" (annotators disagreed) or absent are skipped.
pub fn read_pairs(path: &Path) -> Result<Vec<Pair>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut pairs = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = |what: String| Error::bad_file(path, format!("line {}: {what}", i + 1));
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| at(format!("not JSON ({e})")))?;
        let gold = match value.get("gold_label").and_then(|v| v.as_str()) {
            None | Some("-") | Some("") => continue,
            Some(g) => g,
        };
        let label = CLASSES.iter().position(|c| *c == gold).ok_or_else(|| {
            at(format!(
                "gold_label {gold:?}, expected one of {CLASSES:?} or \"-\""
            ))
        })?;
        let field = |name: &str| {
            value
                .get(name)
                .and_then(|v| v.as_str())
                .map(String::from)
                .ok_or_else(|| at(format!("missing string field {name:?}")))
        };
        pairs.push(Pair {
            premise: field("sentence1")?,
            hypothesis: field("sentence2")?,
            label: label as i64,
        });
    }
    Ok(pairs)
}

/// The model's tokenizer: `tokenizer.json` when the model folder has one, else a BERT WordPiece
/// tokenizer built from `vocab.txt` (lower-casing as `tokenizer_config.json`'s `do_lower_case`
/// says, default true). Pairs are truncated longest-first to `max_len` tokens.
pub fn load_tokenizer(model_dir: &Path, max_len: usize) -> Result<Tokenizer> {
    let json = model_dir.join("tokenizer.json");
    let mut tokenizer = if json.is_file() {
        Tokenizer::from_file(&json).map_err(|e| Error::bad_file(&json, e.to_string()))?
    } else {
        let vocab = model_dir.join("vocab.txt");
        let wordpiece = WordPiece::from_file(&vocab.to_string_lossy())
            .unk_token("[UNK]".into())
            .build()
            .map_err(|e| Error::bad_file(&vocab, e.to_string()))?;
        let id = |token: &str| {
            wordpiece_id(&wordpiece, token).ok_or_else(|| {
                Error::bad_file(&vocab, format!("no {token} token in the vocabulary"))
            })
        };
        let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
        let mut t = Tokenizer::new(wordpiece);
        t.with_normalizer(Some(BertNormalizer::new(
            true,
            true,
            None,
            lower_case(model_dir),
        )));
        t.with_pre_tokenizer(Some(BertPreTokenizer));
        t.with_post_processor(Some(BertProcessing::new(
            ("[SEP]".into(), sep),
            ("[CLS]".into(), cls),
        )));
        t
    };
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_len,
            strategy: TruncationStrategy::LongestFirst,
            ..Default::default()
        }))
        .map_err(|e| Error::bad_value("data.max_seq_len", e.to_string()))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

fn wordpiece_id(wordpiece: &WordPiece, token: &str) -> Option<u32> {
    use tokenizers::Model;
    wordpiece.token_to_id(token)
}

fn lower_case(model_dir: &Path) -> bool {
    std::fs::read_to_string(model_dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("do_lower_case").and_then(|b| b.as_bool()))
        .unwrap_or(true)
}

/// Tokenises pairs into padded [N, T] ids, segment ids and attention mask (T = longest pair).
pub fn encode(tokenizer: &Tokenizer, pairs: &[Pair]) -> Result<Features> {
    let inputs: Vec<tokenizers::EncodeInput> = pairs
        .iter()
        .map(|p| (p.premise.as_str(), p.hypothesis.as_str()).into())
        .collect();
    let encodings = tokenizer
        .encode_batch(inputs, true)
        .map_err(|e| Error::bad_value("tokenizer", e.to_string()))?;
    let width = encodings.iter().map(|e| e.len()).max().unwrap_or(0);
    let n = encodings.len();
    let (mut ids, mut types, mut mask) = (
        vec![0i64; n * width],
        vec![0i64; n * width],
        vec![0i64; n * width],
    );
    for (row, enc) in encodings.iter().enumerate() {
        for (col, ((id, ty), m)) in enc
            .get_ids()
            .iter()
            .zip(enc.get_type_ids())
            .zip(enc.get_attention_mask())
            .enumerate()
        {
            ids[row * width + col] = *id as i64;
            types[row * width + col] = *ty as i64;
            mask[row * width + col] = *m as i64;
        }
    }
    let shape = [n as i64, width as i64];
    Ok(Features::TextPair {
        ids: Tensor::from_slice(&ids).view(shape),
        token_types: Tensor::from_slice(&types).view(shape),
        attention_mask: Tensor::from_slice(&mask).view(shape),
    })
}

fn dataset(tokenizer: &Tokenizer, pairs: &[Pair]) -> Result<Dataset> {
    let labels: Vec<i64> = pairs.iter().map(|p| p.label).collect();
    Ok(Dataset::new(
        encode(tokenizer, pairs)?,
        Tensor::from_slice(&labels),
        None,
    ))
}

/// The file training reads: the train split when present, else the dev split.
pub fn train_file(dir: &Path) -> PathBuf {
    let train = dir.join("snli_1.0_train.jsonl");
    if train.is_file() {
        train
    } else {
        dir.join("snli_1.0_dev.jsonl")
    }
}

/// What the encoder that reads the data admits (`models::bert::BertConfig::encoder_limits`):
/// positions and token ids beyond its tables would index out of range inside LibTorch (a C++
/// panic), so `load` checks them before any tensor.
#[derive(Debug, Clone)]
pub struct EncoderLimits {
    /// Rows of the position table: no encoded pair may be longer.
    pub max_positions: i64,
    /// Rows of the word-piece table: every token id must be below it.
    pub vocab_size: i64,
    /// The file the limits were read from, named in the errors.
    pub source: PathBuf,
}

/// `dir` is the `snli_1.0` folder, `model_dir` the BERT folder whose vocabulary tokenises it,
/// `limits` what its encoder admits.
pub fn load(
    dir: &Path,
    model_dir: &Path,
    max_len: usize,
    limits: &EncoderLimits,
) -> Result<TaskData> {
    require_dir(
        dir,
        "the snli_1.0 folder with snli_1.0_{train,dev,test}.jsonl",
    )?;
    let tokenizer = load_tokenizer(model_dir, max_len)?;
    if max_len as i64 > limits.max_positions {
        return Err(Error::bad_value(
            "data.max_seq_len",
            format!(
                "{max_len}: {} has only {} position embeddings",
                limits.source.display(),
                limits.max_positions
            ),
        ));
    }
    let vocab = tokenizer.get_vocab_size(true) as i64;
    if vocab > limits.vocab_size {
        return Err(Error::bad_file(
            &limits.source,
            format!(
                "vocab_size {}: the tokenizer in {} has {vocab} tokens",
                limits.vocab_size,
                model_dir.display()
            ),
        ));
    }
    let train = read_pairs(&train_file(dir))?;
    let test = read_pairs(&dir.join("snli_1.0_test.jsonl"))?;
    Ok(TaskData {
        train: dataset(&tokenizer, &train)?,
        test: dataset(&tokenizer, &test)?,
        classes: CLASSES.iter().map(|c| c.to_string()).collect(),
    })
}
