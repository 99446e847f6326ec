//! Test-set metrics of a federated run: accuracy, balanced accuracy (the mean of the per-class
//! recalls, as scikit-learn's `balanced_accuracy_score`) and, for two classes, the AUROC (the
//! Mann-Whitney statistic: the probability that a random positive scores above a random
//! negative, ties counting one half).

use crate::host;
use tch::{Kind, Tensor};

/// A model's metrics on one set of examples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean cross-entropy (nats).
    pub loss: f64,
    /// Share of examples classified correctly, in [0, 1].
    pub accuracy: f64,
    /// Mean of the per-class recalls, in [0, 1].
    pub balanced_accuracy: f64,
    /// Two-class problems only.
    pub auroc: Option<f64>,
}

/// Metrics of `logits` [N, classes] against `labels` [N] (int64).
pub fn evaluate(logits: &Tensor, labels: &Tensor) -> Evaluation {
    let classes = logits.size()[1];
    let loss = host::f64_scalar(&logits.cross_entropy_for_logits(labels));
    let predicted = logits.argmax(1, false);
    let correct = predicted.eq_tensor(labels);
    let accuracy = host::f64_scalar(&correct.to_kind(Kind::Double).mean(Kind::Double));
    let mut recalls = Vec::new();
    for c in 0..classes {
        let members = labels.eq(c);
        let count = host::i64_scalar(&members.sum(Kind::Int64));
        if count > 0 {
            let hits = host::i64_scalar(&correct.logical_and(&members).sum(Kind::Int64));
            recalls.push(hits as f64 / count as f64);
        }
    }
    let balanced_accuracy = recalls.iter().sum::<f64>() / recalls.len().max(1) as f64;
    let auroc = (classes == 2).then(|| {
        let scores = logits.select(1, 1) - logits.select(1, 0);
        auroc(&scores, &labels.eq(1))
    });
    Evaluation {
        loss,
        accuracy,
        balanced_accuracy,
        auroc,
    }
}

/// AUROC of `scores` [N] for the boolean `positive` [N], from average ranks (ties share them).
pub fn auroc(scores: &Tensor, positive: &Tensor) -> f64 {
    let scores: Vec<f64> = host::to_vec_f64(&scores.to_kind(Kind::Double)).unwrap_or_default();
    let positive: Vec<bool> = host::to_vec_bool(positive).unwrap_or_default();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let mut ranks = vec![0.0; scores.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let average = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            ranks[k] = average;
        }
        i = j + 1;
    }
    let positives = positive.iter().filter(|&&p| p).count() as f64;
    let negatives = positive.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return f64::NAN;
    }
    let rank_sum: f64 = ranks
        .iter()
        .zip(&positive)
        .filter(|(_, &p)| p)
        .map(|(r, _)| r)
        .sum();
    (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auroc_and_balanced_accuracy_by_hand() {
        // Positives score 0.9, 0.4; negatives 0.5, 0.1, 0.4: pairs won 3 + 1.5 (tie) of 6.
        let scores = Tensor::from_slice(&[0.9, 0.5, 0.4, 0.1, 0.4]);
        let positive = Tensor::from_slice(&[true, false, true, false, false]);
        assert!((auroc(&scores, &positive) - 4.5 / 6.0).abs() < 1e-12);
        // Labels 0,0,0,1: predicting all 0 gives accuracy 0.75, balanced accuracy 0.5.
        let logits = Tensor::from_slice(&[1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]).view([4, 2]);
        let labels = Tensor::from_slice(&[0i64, 0, 0, 1]);
        let e = evaluate(&logits, &labels);
        assert!((e.accuracy - 0.75).abs() < 1e-12);
        assert!((e.balanced_accuracy - 0.5).abs() < 1e-12);
        assert!((e.auroc.unwrap() - 0.5).abs() < 1e-12);
    }
}
