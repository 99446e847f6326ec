//! How a training set is split among federated clients: IID (a shuffled, even split), or non-IID
//! by label, either with per-client class proportions drawn from Dirichlet(α) (Hsu et al. 2019)
//! or as k label-sorted shards per client (McMahan et al. 2017, "pathological non-IID").
//! Every client gets at least one example; the split depends only on the labels and the seed.

use crate::error::{Error, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};
use serde::{Deserialize, Serialize};

/// How a training set is split among federated clients (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Partition {
    /// A shuffled, even split: every client's data follows the whole set's distribution.
    Iid,
    /// Each client's class proportions ~ Dirichlet(alpha); small alpha, few classes per client.
    Dirichlet {
        /// The concentration α > 0.
        alpha: f64,
    },
    /// Sort by label, cut into clients × k shards, deal k shards to each client.
    Shards {
        /// k ≥ 1, the shards each client gets.
        per_client: usize,
    },
}

impl Partition {
    /// `iid`, `dirichlet:ALPHA` or `shards:K`.
    pub fn parse(text: &str) -> Result<Partition> {
        let bad = || {
            Error::bad_value(
                "partition",
                format!("{text:?}: expected iid, dirichlet:ALPHA (ALPHA > 0) or shards:K (K >= 1)"),
            )
        };
        if text == "iid" {
            return Ok(Partition::Iid);
        }
        if let Some(a) = text.strip_prefix("dirichlet:") {
            let alpha: f64 = a.parse().map_err(|_| bad())?;
            return if alpha > 0.0 && alpha.is_finite() {
                Ok(Partition::Dirichlet { alpha })
            } else {
                Err(bad())
            };
        }
        if let Some(k) = text.strip_prefix("shards:") {
            let per_client: usize = k.parse().map_err(|_| bad())?;
            return if per_client >= 1 {
                Ok(Partition::Shards { per_client })
            } else {
                Err(bad())
            };
        }
        Err(bad())
    }

    /// The form `parse` reads back: `iid`, `dirichlet:ALPHA` or `shards:K`.
    pub fn name(&self) -> String {
        match self {
            Partition::Iid => "iid".into(),
            Partition::Dirichlet { alpha } => format!("dirichlet:{alpha}"),
            Partition::Shards { per_client } => format!("shards:{per_client}"),
        }
    }

    /// The example indices of each of `clients` clients, from the labels (0..classes).
    pub fn split(&self, labels: &[i64], clients: usize, seed: u64) -> Result<Vec<Vec<i64>>> {
        let n = labels.len();
        if clients == 0 || clients > n {
            return Err(Error::bad_value(
                "clients",
                format!("{clients}: expected 1..={n} (one example per client at least)"),
            ));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut parts = match *self {
            Partition::Iid => {
                let mut order: Vec<i64> = (0..n as i64).collect();
                order.shuffle(&mut rng);
                even_split(&order, clients)
            }
            Partition::Shards { per_client } => {
                let shards = clients.saturating_mul(per_client);
                if shards > n {
                    return Err(Error::bad_value(
                        "partition",
                        format!("shards:{per_client} with {clients} clients needs {shards} shards of at least one of {n} examples"),
                    ));
                }
                let mut order: Vec<i64> = (0..n as i64).collect();
                order.shuffle(&mut rng);
                order.sort_by_key(|&i| labels[i as usize]);
                let mut pieces = even_split(&order, shards);
                pieces.shuffle(&mut rng);
                pieces
                    .chunks(per_client)
                    .map(|c| c.concat())
                    .collect::<Vec<_>>()
            }
            Partition::Dirichlet { alpha } => dirichlet_split(labels, clients, alpha, &mut rng)?,
        };
        // Clients left empty by the Dirichlet draw take one example from the largest client.
        for k in 0..clients {
            if parts[k].is_empty() {
                let largest = (0..clients).max_by_key(|&j| parts[j].len()).unwrap();
                let moved = parts[largest].pop().unwrap();
                parts[k].push(moved);
            }
        }
        Ok(parts)
    }
}

/// `items` cut into `parts` contiguous pieces whose sizes differ by at most one.
fn even_split(items: &[i64], parts: usize) -> Vec<Vec<i64>> {
    let n = items.len();
    (0..parts)
        .map(|k| items[k * n / parts..(k + 1) * n / parts].to_vec())
        .collect()
}

/// For each class, its examples are dealt to the clients in proportions p ~ Dirichlet(α)
/// (drawn as normalised Gamma(α, 1) variables).
fn dirichlet_split(
    labels: &[i64],
    clients: usize,
    alpha: f64,
    rng: &mut rand::rngs::StdRng,
) -> Result<Vec<Vec<i64>>> {
    let gamma = Gamma::new(alpha, 1.0)
        .map_err(|e| Error::bad_value("partition", format!("dirichlet:{alpha}: {e}")))?;
    let classes = labels.iter().copied().max().unwrap_or(0) as usize + 1;
    let mut parts = vec![Vec::new(); clients];
    for class in 0..classes {
        let mut members: Vec<i64> = (0..labels.len() as i64)
            .filter(|&i| labels[i as usize] == class as i64)
            .collect();
        members.shuffle(rng);
        let weights: Vec<f64> = (0..clients)
            .map(|_| gamma.sample(rng).max(1e-300))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut cumulative = 0.0;
        let mut start = 0;
        for (k, w) in weights.iter().enumerate() {
            cumulative += w / total;
            let end = if k + 1 == clients {
                members.len()
            } else {
                ((cumulative * members.len() as f64).round() as usize).min(members.len())
            };
            parts[k].extend_from_slice(&members[start..end.max(start)]);
            start = end.max(start);
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(n: usize, classes: i64) -> Vec<i64> {
        (0..n as i64).map(|i| i % classes).collect()
    }

    fn check_cover(parts: &[Vec<i64>], n: usize) {
        let mut all: Vec<i64> = parts.concat();
        all.sort();
        assert_eq!(all, (0..n as i64).collect::<Vec<_>>());
        assert!(parts.iter().all(|p| !p.is_empty()));
    }

    #[test]
    fn partitions_cover_every_example_once() {
        let y = labels(1000, 10);
        let iid = Partition::Iid.split(&y, 7, 1).unwrap();
        check_cover(&iid, 1000);
        assert!(iid.iter().all(|p| p.len() == 142 || p.len() == 143));
        let shards = Partition::parse("shards:2")
            .unwrap()
            .split(&y, 50, 1)
            .unwrap();
        check_cover(&shards, 1000);
        // Two label-sorted shards of 10 examples: at most two classes per client.
        for p in &shards {
            let mut classes: Vec<i64> = p.iter().map(|&i| y[i as usize]).collect();
            classes.dedup();
            classes.sort();
            classes.dedup();
            assert!(classes.len() <= 2, "{classes:?}");
        }
        let skewed = Partition::parse("dirichlet:0.1")
            .unwrap()
            .split(&y, 20, 1)
            .unwrap();
        check_cover(&skewed, 1000);
        // Small alpha: a typical client holds few classes.
        let mean_classes: f64 = skewed
            .iter()
            .map(|p| {
                let mut c: Vec<i64> = p.iter().map(|&i| y[i as usize]).collect();
                c.sort();
                c.dedup();
                c.len() as f64
            })
            .sum::<f64>()
            / 20.0;
        assert!(mean_classes < 5.0, "{mean_classes}");
        assert_eq!(
            skewed,
            Partition::Dirichlet { alpha: 0.1 }
                .split(&y, 20, 1)
                .unwrap()
        );
        assert!(Partition::parse("dirichlet:0").is_err());
        assert!(Partition::parse("shards").is_err());
    }
}
