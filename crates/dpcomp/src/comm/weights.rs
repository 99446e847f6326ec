//! The workers of a data-parallel run start from the same weights: each builds its model from
//! the run's seed, rank 0 broadcasts its weights, and every rank compares them with its own
//! before the first step. A rank whose weights differ (another seed, another configuration,
//! another build) makes the check fail on every rank, naming the ranks and the first parameter
//! that differs.

use super::Communicator;
use crate::error::Result;
use tch::{Device, Tensor};

/// The tensors' values as bytes, in order (each in its own kind, little-endian as in memory).
pub(crate) fn parameter_bytes(params: &[(String, Tensor)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (_, p) in params {
        let p = p.detach().to_device(Device::Cpu).contiguous();
        bytes.extend(crate::host::to_bytes(&p));
    }
    bytes
}

/// The first parameter whose bytes in `theirs` differ from `mine` (both `parameter_bytes` of
/// the same list), or a note that the lengths differ.
fn first_difference(params: &[(String, Tensor)], mine: &[u8], theirs: &[u8]) -> Option<String> {
    if mine.len() != theirs.len() {
        return Some(format!(
            "{} bytes of parameters against rank 0's {}",
            mine.len(),
            theirs.len()
        ));
    }
    let mut at = 0;
    for (name, p) in params {
        let length = p.numel() * p.kind().elt_size_in_bytes();
        if mine[at..at + length] != theirs[at..at + length] {
            return Some(format!("parameter {name} differs"));
        }
        at += length;
    }
    None
}

/// Rank 0 broadcasts its parameters; every rank compares them with its own. Every rank returns
/// the same verdict: Ok, or an error listing each rank whose weights differ and where.
pub fn check_initial_weights(
    comm: &mut dyn Communicator,
    params: &[(String, Tensor)],
) -> Result<()> {
    let mine = parameter_bytes(params);
    let mut root = if comm.rank() == 0 {
        mine.clone()
    } else {
        Vec::new()
    };
    comm.broadcast(0, &mut root)?;
    let verdict = first_difference(params, &mine, &root).unwrap_or_default();
    let verdicts = comm.all_gather(verdict.as_bytes())?;
    let differ: Vec<String> = verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(r, v)| format!("rank {r}: {}", String::from_utf8_lossy(v)))
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(comm.error(format!(
            "the initial weights differ from rank 0's ({}): every rank must build the model from the same seed and configuration",
            differ.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::ThreadGroup;

    fn weights(seed: i64) -> Vec<(String, Tensor)> {
        tch::manual_seed(seed);
        let opts = (tch::Kind::Float, Device::Cpu);
        vec![
            ("layer.weight".to_string(), Tensor::randn([4, 3], opts)),
            ("layer.bias".to_string(), Tensor::randn([4], opts)),
        ]
    }

    #[test]
    fn same_seeds_pass_and_a_rank_with_another_seed_fails_everywhere() {
        let _serial = crate::test_serial();
        let results = ThreadGroup::run(3, |mut comm| {
            check_initial_weights(&mut comm, &weights(5)).map_err(|e| e.to_string())
        })
        .unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let results = ThreadGroup::run(3, |mut comm| {
            let seed = if comm.rank() == 2 { 6 } else { 5 };
            check_initial_weights(&mut comm, &weights(seed)).map_err(|e| e.to_string())
        })
        .unwrap();
        for (rank, result) in results.iter().enumerate() {
            let message = result.as_ref().unwrap_err();
            assert!(
                message.contains("rank 2: parameter layer.weight differs")
                    && !message.contains("rank 1:"),
                "rank {rank}: {message}"
            );
        }
    }
}
