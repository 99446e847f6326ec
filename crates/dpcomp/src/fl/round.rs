//! One round of Kerkouche et al. 2021's Algorithm 1 (with Algorithm 3's server for FL-CS), in
//! the order it happens (module docs of `fl` for the formulas):
//!
//! 1. `sample_clients`: each client takes part with probability C (Poisson sampling);
//! 2. `client_messages`: each sampled client's T_gd local steps (`client::client_update`), its
//!    update encoded and sent as bytes (`messages`), then clipped to S (DP) or weighted by its
//!    examples (no DP);
//! 3. `canary_messages`: an audited run's canary clients, clipped with the others;
//! 4. `Server::step`: the sum noised (DP) or averaged, decoded, and the server's momentum step.

use super::messages::RoundMessages;
use super::model::FlModel;
use super::task::Task;
use super::{sample_clients, FlSettings};
use crate::compress::linear_sketch::Scheme;
use crate::error::Result;
use crate::privacy::canary::GradientCanaries;
use crate::privacy::engine::{Clipped, PrivacyEngine};
use std::time::Instant;
use tch::{Kind, Tensor};

/// The clients' side of a run on dpcomp's networks (`Task::Fl`): the data they split, each
/// one's examples, and the model a client trains (one, reused by every client in turn).
pub(crate) struct Clients {
    /// The training features and labels on the run's device.
    pub x: Tensor,
    pub y: Tensor,
    /// Each client's examples: row indices into `x` and `y`.
    pub shards: Vec<Vec<i64>>,
    /// The model a client's local steps run on.
    pub model: FlModel,
}

/// What the server carries from round to round.
pub(crate) struct Server {
    /// The global weights w [n].
    pub w: Tensor,
    /// The momentum u (Algorithm 3: in the compressed domain for FL-CS), after the first round.
    pub momentum: Option<Tensor>,
    /// The clients' encoders and the server's decoder (FL-CS's error e).
    pub messages: RoundMessages,
    /// Client-level DP: clipping, the noise and the accountant (private runs).
    pub engine: Option<PrivacyEngine>,
    /// White-box canary clients (audited runs).
    pub canaries: Option<GradientCanaries>,
    /// n, the model's parameters.
    pub parameters: i64,
    /// m: the sketch's length, or (compressors) the elements of the last message.
    pub message_length: i64,
    /// P, the sketch's DCT chunks (FL-FREQ and FL-CS).
    pub chunks: Option<i64>,
}

/// What a round's clients sent, for its row of metrics.
pub(crate) struct RoundReport {
    /// The clients sampled (canaries not counted).
    pub clients: usize,
    /// Bits they sent.
    pub bits: u64,
    /// Mean norm of their messages before clipping.
    pub message_norm: f64,
    /// DP: how many of their messages were longer than S.
    pub clipped: Option<usize>,
    /// Seconds of the clients' part and of the server's.
    pub client_seconds: f64,
    pub server_seconds: f64,
}

/// The round's messages as the server sums them.
struct Aggregation {
    /// DP: the clipped messages' sum (and how many were clipped).
    clipped: Clipped,
    /// No DP: Σ_k |D_k| C(Δw_k) and Σ_k |D_k|.
    weighted: Tensor,
    weight_total: f64,
    /// The clients' message norms before clipping, and the bits they sent.
    norms: Vec<f64>,
    bits: u64,
    /// Canary messages in `clipped` (always clipped).
    canaries: usize,
}

/// Runs round `round` (from 1): the clients' messages, then the server's step on `server.w`.
pub(crate) fn run_round(
    settings: &FlSettings,
    task: &mut Task,
    server: &mut Server,
    round: usize,
) -> Result<RoundReport> {
    let sampled = sample_clients(settings.seed, round, settings.clients, settings.fraction);
    let client_start = Instant::now();
    let mut aggregation = client_messages(settings, task, server, &sampled, round)?;
    canary_messages(server, &mut aggregation, round)?;
    let client_seconds = client_start.elapsed().as_secs_f64();
    let server_start = Instant::now();
    server.step(settings, &aggregation, round)?;
    let server_seconds = server_start.elapsed().as_secs_f64();
    let clipped = server.engine.as_ref().map(|_| {
        crate::host::i64_scalar(&aggregation.clipped.clipped) as usize - aggregation.canaries
    });
    let norms = &aggregation.norms;
    Ok(RoundReport {
        clients: sampled.len(),
        bits: aggregation.bits,
        message_norm: norms.iter().sum::<f64>() / norms.len().max(1) as f64,
        clipped,
        client_seconds,
        server_seconds,
    })
}

/// Each sampled client's update (T_gd local steps from w), encoded, sent as bytes and read by
/// the server; clipped to S (DP) or weighted by the client's examples (no DP).
fn client_messages(
    settings: &FlSettings,
    task: &mut Task,
    server: &mut Server,
    sampled: &[usize],
    round: usize,
) -> Result<Aggregation> {
    let mut aggregation = Aggregation::empty(server, sampled.len());
    for &k in sampled {
        let update = task.update(
            &server.w,
            k,
            &settings.local,
            local_seed(settings, round, k),
        )?;
        let received = server.messages.send(&update, round)?;
        aggregation.bits += 8 * received.bytes as u64;
        if !server.messages.is_linear() {
            server.message_length = received.elements as i64;
        }
        let value = received.value;
        aggregation
            .norms
            .push(crate::host::f64_scalar(&value.norm()));
        match &server.engine {
            Some(engine) => aggregation.clipped.add(engine.clip_update(&value)),
            None => {
                let weight = task.examples(k) as f64;
                aggregation.weighted += value * weight;
                aggregation.weight_total += weight;
            }
        }
    }
    Ok(aggregation)
}

/// The seed of client `k`'s mini-batches in round `round` (`LocalTraining`).
fn local_seed(settings: &FlSettings, round: usize, k: usize) -> u64 {
    settings.seed ^ ((round * settings.clients + k) as u64).wrapping_mul(0x9E37_79B9)
}

/// An audited run's sampled canary clients: each sends its update through the round's encoder
/// and is clipped to S with the clients (`FederatedRunBuilder::canaries`).
fn canary_messages(server: &mut Server, aggregation: &mut Aggregation, round: usize) -> Result<()> {
    let (Some(canaries), Some(engine)) = (server.canaries.as_mut(), &server.engine) else {
        return Ok(());
    };
    let device = server.w.device();
    for i in canaries.sample() {
        aggregation.canaries += 1;
        let received = server
            .messages
            .send(&canaries.flat_gradient(i, device), round)?;
        aggregation.clipped.add(engine.clip_update(&received.value));
    }
    Ok(())
}

impl Aggregation {
    /// Nothing summed yet, in the domain the server sums in: m values for the linear sketches,
    /// the n model coordinates for the compressors the server decodes per message.
    fn empty(server: &Server, clients: usize) -> Aggregation {
        let length = if server.messages.is_linear() {
            server.message_length
        } else {
            server.parameters
        };
        let weighted = Tensor::zeros([length], (Kind::Float, server.w.device()));
        Aggregation {
            clipped: Clipped::empty(&[weighted.shallow_clone()]),
            weighted,
            weight_total: 0.0,
            norms: Vec::with_capacity(clients),
            bits: 0,
            canaries: 0,
        }
    }
}

impl Server {
    /// The server's part: y, the noised sum over C N (DP; the noise is drawn and the round
    /// counted even when no client was sampled) or the weighted mean; then FL-CS's
    /// Algorithm 3 (u = β u + y; e += η u; s = BPDN(e); w += s) or, for the other schemes,
    /// d = Cᵀ y, u = β u + d, w += η u. An audited run's canaries see the new weights.
    fn step(
        &mut self,
        settings: &FlSettings,
        aggregation: &Aggregation,
        round: usize,
    ) -> Result<()> {
        let y = match self.engine.as_mut() {
            Some(engine) => engine.privatize(&aggregation.clipped)?.remove(0),
            None if aggregation.weight_total > 0.0 => {
                &aggregation.weighted / aggregation.weight_total
            }
            None => aggregation.weighted.shallow_clone(),
        };
        let step = if settings.scheme() == Scheme::Cs {
            let u = self.with_momentum(settings.server_momentum, y);
            self.messages
                .decode(&(&u * settings.server_learning_rate), round)
        } else {
            let d = self.messages.decode(&y, round);
            self.with_momentum(settings.server_momentum, d) * settings.server_learning_rate
        };
        self.w += step;
        if let Some(canaries) = self.canaries.as_mut() {
            canaries.observe_step(
                std::slice::from_ref(&self.w),
                settings.fraction * settings.clients as f64,
            );
        }
        Ok(())
    }

    /// ε after the rounds so far (private runs).
    pub fn epsilon(&self) -> Result<Option<f64>> {
        self.engine.as_ref().map(|e| e.epsilon()).transpose()
    }

    /// u = β u + d (u = d in the first round or without momentum), kept for the next round.
    fn with_momentum(&mut self, beta: f64, d: Tensor) -> Tensor {
        let u = match self.momentum.take() {
            Some(u) if beta > 0.0 => u * beta + d,
            _ => d,
        };
        self.momentum = Some(u.shallow_clone());
        u
    }
}
