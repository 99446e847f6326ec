//! Loaders on the real files of the data folder ($DPCOMP_DATA) and on tiny files in the same layouts.

use crate::common;
use common::{require_shared_data, write_cifar_file};
use dpcomp::data::{cifar, names, snli, Dataset, Features};
use tch::{Device, Kind, Tensor};

#[test]
fn fold_to_ascii_drops_accents_like_the_tutorial() {
    assert_eq!(names::fold_to_ascii("Ślusàrski"), "Slusarski");
    assert_eq!(names::fold_to_ascii("O'Néàl"), "O'Neal");
    assert_eq!(names::fold_to_ascii("Führer"), "Fuhrer");
    assert_eq!(names::fold_to_ascii("Æbeltoft"), "beltoft"); // no decomposition: dropped
}

#[test]
fn names_real_data_split_is_deterministic_80_20() {
    let Some(root) = require_shared_data() else {
        return;
    };
    let (examples, classes) = names::read_names(&root.join("names")).unwrap();
    assert_eq!(examples.len(), 20_050);
    assert_eq!(classes.len(), 18);
    assert_eq!(classes[0], "Arabic");
    let a = names::load(&root.join("names"), 7).unwrap();
    let b = names::load(&root.join("names"), 7).unwrap();
    assert_eq!(a.train.len(), 16_040);
    assert_eq!(a.test.len(), 4_010);
    assert!(a.train.labels.equal(&b.train.labels));
    let c = names::load(&root.join("names"), 8).unwrap();
    assert!(!a.train.labels.equal(&c.train.labels));
    // Majority class (Russian) is about 47% of the names.
    let counts = a.test.labels.bincount(None::<Tensor>, 18);
    let majority = counts.max().int64_value(&[]) as f64 / 4010.0;
    assert!((0.43..0.51).contains(&majority), "{majority}");
}

#[test]
fn names_batches_are_padded_with_true_lengths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("A.txt"), "Abe\nÁlvaro\n\n").unwrap();
    std::fs::write(dir.path().join("B.txt"), "Bo\n").unwrap();
    let (examples, classes) = names::read_names(dir.path()).unwrap();
    assert_eq!(classes, vec!["A", "B"]);
    assert_eq!(
        examples,
        vec![("Abe".into(), 0), ("Alvaro".into(), 0), ("Bo".into(), 1)]
    );
    let Features::Tokens { ids, lengths } = names::encode(&["Abe", "Bo"]) else {
        panic!()
    };
    assert_eq!(Vec::<i64>::try_from(&lengths).unwrap(), vec![3, 2]);
    assert_eq!(
        Vec::<i64>::try_from(&ids.view(-1)).unwrap(),
        vec![65, 98, 101, 66, 111, 0]
    );
}

#[test]
fn names_errors_name_the_folder_or_file() {
    let err = names::read_names(std::path::Path::new("/nonexistent/names"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/nonexistent/names") && err.contains("no such folder"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Bad.txt"), [0x41, 0xff, 0x42]).unwrap();
    let err = names::read_names(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("Bad.txt") && err.contains("not UTF-8 at byte 1"),
        "{err}"
    );
}

#[test]
fn cifar10_real_data_has_50000_and_10000_balanced_images() {
    let Some(root) = common::require_cifar10() else {
        return;
    };
    let data = cifar::load_cifar10(&root.join("cifar-10-batches-bin"), false).unwrap();
    assert_eq!(data.train.len(), 50_000);
    assert_eq!(data.test.len(), 10_000);
    assert_eq!(data.classes.len(), 10);
    assert_eq!(data.classes[0], "airplane");
    let counts = data.test.labels.bincount(None::<Tensor>, 10);
    assert_eq!(Vec::<i64>::try_from(&counts).unwrap(), vec![1000; 10]);
    let index = Tensor::arange(256, (Kind::Int64, Device::Cpu));
    let batch = data.train.batch(&index, Device::Cpu, false);
    let Features::Images(x) = &batch.features else {
        panic!()
    };
    assert_eq!(x.size(), vec![256, 3, 32, 32]);
    // Normalised with the dataset's channel statistics: mean near 0, std near 1.
    let mean = x.mean(Kind::Float).double_value(&[]);
    let std = x.std(true).double_value(&[]);
    assert!(
        mean.abs() < 0.1 && (std - 1.0).abs() < 0.1,
        "mean {mean} std {std}"
    );
}

#[test]
fn cifar_augmentation_crops_and_flips_within_padding() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for i in 1..=5 {
        write_cifar_file(
            &d.join(format!("data_batch_{i}.bin")),
            &[(vec![i as u8], 100), (vec![0], 50)],
        );
    }
    write_cifar_file(&d.join("test_batch.bin"), &[(vec![9], 10)]);
    let data = cifar::load_cifar10(d, true).unwrap();
    assert_eq!(data.train.len(), 10);
    assert_eq!(Vec::<i64>::try_from(&data.test.labels).unwrap(), vec![9]);
    tch::manual_seed(3);
    let index = Tensor::arange(10, (Kind::Int64, Device::Cpu));
    let Features::Images(x) = data.train.batch(&index, Device::Cpu, true).features else {
        panic!()
    };
    // A constant image stays constant except for the zero padding a crop brings in: every pixel
    // of every image and channel is either its normalised value (the un-augmented batch's) or
    // the padding value 0, the central 24x24 is intact, and some crop did move.
    let Features::Images(plain) = data.train.batch(&index, Device::Cpu, false).features else {
        panic!()
    };
    assert_eq!(plain.size(), x.size());
    assert!(
        plain.abs().min().double_value(&[]) > 0.1,
        "fills normalise away from 0"
    );
    let is_value = (&x - &plain).abs().lt(1e-6);
    let is_padding = x.abs().lt(1e-6);
    assert!(bool::try_from(is_value.logical_or(&is_padding).all()).unwrap());
    let centre = |t: &Tensor| t.narrow(2, 4, 24).narrow(3, 4, 24);
    assert!((centre(&x) - centre(&plain)).abs().max().double_value(&[]) < 1e-6);
    assert!(
        bool::try_from(is_padding.any()).unwrap(),
        "no crop moved in 10 images"
    );
}

#[test]
fn cifar_bad_files_give_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for i in 1..=5 {
        write_cifar_file(&d.join(format!("data_batch_{i}.bin")), &[(vec![1], 0)]);
    }
    // Truncated: one whole record and half of another.
    let mut bytes = vec![0u8; 3073 + 1500];
    bytes[0] = 3;
    std::fs::write(d.join("test_batch.bin"), &bytes).unwrap();
    let err = cifar::load_cifar10(d, false).unwrap_err().to_string();
    assert!(
        err.contains("test_batch.bin") && err.contains("record 1 is truncated"),
        "{err}"
    );
    write_cifar_file(&d.join("test_batch.bin"), &[(vec![2], 0), (vec![12], 0)]);
    let err = cifar::load_cifar10(d, false).unwrap_err().to_string();
    assert!(
        err.contains("test_batch.bin") && err.contains("record 1: label 12, expected 0..9"),
        "{err}"
    );
    std::fs::remove_file(d.join("data_batch_3.bin")).unwrap();
    let err = cifar::load_cifar10(d, false).unwrap_err().to_string();
    assert!(err.contains("data_batch_3.bin"), "{err}");
}

#[test]
fn cifar100_tiny_files_in_the_official_layout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_cifar_file(
        &d.join("train.bin"),
        &[(vec![3, 77], 1), (vec![19, 99], 2), (vec![0, 0], 3)],
    );
    write_cifar_file(&d.join("test.bin"), &[(vec![5, 42], 4)]);
    let fine = cifar::load_cifar100(d, cifar::Cifar100Labels::Fine, false).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(&fine.train.labels).unwrap(),
        vec![77, 99, 0]
    );
    assert_eq!(fine.classes.len(), 100);
    let coarse = cifar::load_cifar100(d, cifar::Cifar100Labels::Coarse, false).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(&coarse.train.labels).unwrap(),
        vec![3, 19, 0]
    );
    let Features::Images(x) = &coarse.test.features else {
        panic!()
    };
    assert_eq!(
        Vec::<u8>::try_from(&x.view(-1).narrow(0, 0, 2)).unwrap(),
        vec![4, 4]
    );
    write_cifar_file(&d.join("test.bin"), &[(vec![5, 100], 4)]);
    let err = cifar::load_cifar100(d, cifar::Cifar100Labels::Fine, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("record 0: label 100, expected 0..99"), "{err}");
}

#[test]
fn snli_real_data_tokenised_as_cls_a_sep_b_sep() {
    let Some(root) = common::require_snli() else {
        return;
    };
    let dir = root.join("snli_1.0");
    let dev = snli::read_pairs(&dir.join("snli_1.0_dev.jsonl")).unwrap();
    let test = snli::read_pairs(&dir.join("snli_1.0_test.jsonl")).unwrap();
    assert_eq!(dev.len(), 9_842);
    assert_eq!(test.len(), 9_824);
    let tokenizer = snli::load_tokenizer(&common::bert_dir(), 128).unwrap();
    let Features::TextPair {
        ids,
        token_types,
        attention_mask,
    } = snli::encode(&tokenizer, &dev[..2]).unwrap()
    else {
        panic!()
    };
    let row: Vec<i64> = Vec::try_from(&ids.get(0)).unwrap();
    let types: Vec<i64> = Vec::try_from(&token_types.get(0)).unwrap();
    let n = attention_mask.get(0).sum(Kind::Int64).int64_value(&[]) as usize;
    assert_eq!(row[0], 101, "[CLS]");
    assert_eq!(row[n - 1], 102, "[SEP] at the end");
    let first_sep = row.iter().position(|&t| t == 102).unwrap();
    assert!(first_sep < n - 1);
    assert!(types[..=first_sep].iter().all(|&t| t == 0));
    assert!(types[first_sep + 1..n].iter().all(|&t| t == 1));
    // Truncation to max_len.
    let short = snli::load_tokenizer(&common::bert_dir(), 16).unwrap();
    let Features::TextPair { ids, .. } = snli::encode(&short, &dev[..50]).unwrap() else {
        panic!()
    };
    assert_eq!(ids.size()[1], 16);
}

#[test]
fn snli_vocab_txt_tokenizer_matches_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        common::bert_dir().join("vocab.txt"),
        dir.path().join("vocab.txt"),
    )
    .unwrap();
    let from_vocab = snli::load_tokenizer(dir.path(), 128).unwrap();
    let from_json = snli::load_tokenizer(&common::bert_dir(), 128).unwrap();
    let pairs = vec![snli::Pair {
        premise: "A Man, playing the GUITAR.".into(),
        hypothesis: "Someone performs unaffordably!".into(),
        label: 0,
    }];
    let (Features::TextPair { ids: a, .. }, Features::TextPair { ids: b, .. }) = (
        snli::encode(&from_vocab, &pairs).unwrap(),
        snli::encode(&from_json, &pairs).unwrap(),
    ) else {
        panic!()
    };
    assert!(a.equal(&b), "{a} vs {b}");
}

#[test]
fn snli_skips_unlabelled_and_rejects_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"gold_label": "neutral", "sentence1": "a", "sentence2": "b"}"#,
            "\n",
            r#"{"gold_label": "-", "sentence1": "c", "sentence2": "d"}"#,
            "\n",
            r#"{"gold_label": "contradiction", "sentence1": "e", "sentence2": "f"}"#,
            "\n",
        ),
    )
    .unwrap();
    let pairs = snli::read_pairs(&path).unwrap();
    assert_eq!(
        pairs.iter().map(|p| p.label).collect::<Vec<_>>(),
        vec![1, 2]
    );
    std::fs::write(
        &path,
        "{\"gold_label\": \"neutral\", \"sentence1\": \"a\", \"sentence2\": \"b\"}\n{oops\n",
    )
    .unwrap();
    let err = snli::read_pairs(&path).unwrap_err().to_string();
    assert!(
        err.contains("x.jsonl") && err.contains("line 2: not JSON"),
        "{err}"
    );
    std::fs::write(
        &path,
        "{\"gold_label\": \"maybe\", \"sentence1\": \"a\", \"sentence2\": \"b\"}\n",
    )
    .unwrap();
    let err = snli::read_pairs(&path).unwrap_err().to_string();
    assert!(err.contains("line 1: gold_label \"maybe\""), "{err}");
    std::fs::write(
        &path,
        "{\"gold_label\": \"neutral\", \"sentence1\": \"a\"}\n",
    )
    .unwrap();
    let err = snli::read_pairs(&path).unwrap_err().to_string();
    assert!(err.contains("missing string field \"sentence2\""), "{err}");
}

/// The batch path of a dataset held on an accelerator (`Dataset::to_device`: rows gathered where
/// the examples are, padding trimmed from widths kept on the host) against the host path, on
/// the CPU: the same rows, the same trimmed width, for names and for sentence pairs.
#[test]
fn device_held_batches_equal_host_batches() {
    let names = ["Abe", "Catalina", "Bo", "Dmitri", "Eve"];
    let tokenizer = snli::load_tokenizer(&common::bert_dir(), 32).unwrap();
    let pairs: Vec<snli::Pair> = [
        ("a man", "people"),
        ("two women walk", "a man sleeps tonight"),
        ("x", "y"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (a, b))| snli::Pair {
        premise: a.to_string(),
        hypothesis: b.to_string(),
        label: i as i64,
    })
    .collect();
    let sets = [
        Dataset::new(
            names::encode(&names),
            Tensor::from_slice(&[0i64, 1, 2, 0, 1]),
            None,
        ),
        Dataset::new(
            snli::encode(&tokenizer, &pairs).unwrap(),
            Tensor::from_slice(&[0i64, 1, 2]),
            None,
        ),
    ];
    for host in sets {
        let mut held = Dataset::new(
            host.features.to_device(Device::Cpu),
            host.labels.copy(),
            None,
        );
        held.host_widths = held.features.widths();
        assert!(held.host_widths.is_some());
        // Two short rows: the batch must be trimmed to their width, not the dataset's.
        let index = Tensor::from_slice(&[2i64, 0]);
        let (a, b) = (
            host.batch(&index, Device::Cpu, false),
            held.batch(&index, Device::Cpu, false),
        );
        assert_eq!(
            Vec::<i64>::try_from(&a.labels).unwrap(),
            Vec::<i64>::try_from(&b.labels).unwrap()
        );
        let flat = |f: &Features| -> Vec<Vec<i64>> {
            match f {
                Features::Tokens { ids, lengths } => vec![
                    Vec::try_from(&ids.flatten(0, -1)).unwrap(),
                    Vec::try_from(lengths).unwrap(),
                    vec![ids.size()[1]],
                ],
                Features::TextPair {
                    ids,
                    token_types,
                    attention_mask,
                } => vec![
                    Vec::try_from(&ids.flatten(0, -1)).unwrap(),
                    Vec::try_from(&token_types.flatten(0, -1)).unwrap(),
                    Vec::try_from(&attention_mask.flatten(0, -1)).unwrap(),
                    vec![ids.size()[1]],
                ],
                Features::Images(_) | Features::Rows(_) => unreachable!(),
            }
        };
        assert_eq!(flat(&a.features), flat(&b.features));
        let full_width = match &host.features {
            Features::Tokens { ids, .. } | Features::TextPair { ids, .. } => ids.size()[1],
            Features::Images(_) | Features::Rows(_) => unreachable!(),
        };
        let width = *flat(&b.features).last().unwrap().last().unwrap();
        assert!(width < full_width, "trimmed {width} of {full_width}");
        // Moving a held dataset (to the same device) keeps it as it is.
        let again = held.to_device(Device::Cpu);
        assert!(again.host_widths.is_some());
    }
}
