//! The federated paper's linear sketches as compressors of any training run
//! (Kerkouche, Ács, Castelluccia, Genevès, "Compression Boosts Differentially Private Federated Learning", 2021): the worker sends
//! m = n / rate values of its whole update flattened (parameters in the order given), with no
//! indices, because every participant derives the sketch from a shared seed:
//!
//! - `fl-rnd`: m coordinates drawn anew every step (FL-RND); decoded by zero filling;
//! - `fl-freq`: the first m/P orthonormal DCT-II coefficients of P contiguous chunks (FL-FREQ);
//!   decoded by zero filling;
//! - `fl-cs`: the same coefficients of the update shuffled by the shared permutation (FL-CS),
//!   reconstructed by basis pursuit denoising, min ½‖A s − e‖² + λ‖s‖₁ per chunk with OWL-QN,
//!   λ a fraction of ‖Aᵀe‖∞ per chunk, from the receiver's error e in the compressed domain
//!   (Algorithm 3's server without its momentum, which in a training run is the optimiser's):
//!   e ← e + y; s ← BPDN(e); e ← e − A s.
//!
//! A message is one dense payload of m fp32 values, so its upstream bits are 32 m plus the
//! wire header, and `rate` is exactly dense bits / message bits as for the sparsifiers.
//!
//! Worker-side error feedback (`error_feedback=true`, off by default as in the paper's FL-RND)
//! is offered for `fl-rnd` only: it keeps r = x − Cᵀ C x, the coordinates not sent. FL-FREQ
//! sends the same rows every step, so its residual would grow without ever being sent; FL-CS's
//! feedback is the receiver's error above (`error_feedback=false` turns it off: each message
//! is then reconstructed on its own).
//!
//! FL-RND and FL-FREQ encode and decode without a host read. FL-RND draws each step's
//! coordinates on the host and copies them to the device (a copy there, not a read back).
//! FL-CS's OWL-QN reads from the device in every iteration (`owlqn`, the known exception to a
//! step without host reads).

use super::chunked_dct::DctRows;
use super::codec::{
    flatten, mean_of_dense_messages, split, take_state, AllReduce, Decoder, Encoder,
};
use super::linear_sketch::{Codec, Scheme};
use super::message::{Message, Payload};
use super::owlqn::{owlqn, Measurement, OwlqnSettings};
use crate::error::{Error, Result};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// The sketch and its settings (`Compressor::Sketch`; in a `[compression]` table `kind` fl-rnd,
/// fl-freq or fl-cs and the keys its scheme reads, `compress::settings`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sketch {
    /// Which of the paper's sketches (FL-RND, FL-FREQ, FL-CS; FL-STD only inside a federated
    /// round, where it sends the whole update).
    pub scheme: Scheme,
    /// The compression rate n / m >= 1, as every compressor's `rate` (the federated paper
    /// reports r = m / n = 1 / rate; the codec is built from that r).
    pub rate: f64,
    /// P, the DCT chunks (default ⌈n / 1024⌉).
    pub chunks: Option<i64>,
    /// FL-CS's DCT rows per chunk: the first ones (the paper's) or a seeded random subset.
    pub rows: DctRows,
    /// The seed every participant shares (coordinates, permutation, random rows).
    pub seed: u64,
    /// FL-CS: λ as a fraction of ‖Aᵀe‖∞ per chunk.
    pub lambda: f64,
    /// FL-CS: OWL-QN iterations per message.
    pub iterations: usize,
    /// FL-RND: the worker's residual; FL-CS: the receiver's error in the compressed domain.
    pub error_feedback: bool,
}

impl Sketch {
    /// `scheme` at rate n / m = `rate`, with the command line's defaults: ⌈n / 1024⌉ chunks, the
    /// first DCT rows, seed 0, λ 0.01 and 100 OWL-QN iterations (FL-CS), error feedback for
    /// FL-CS only (Algorithm 3's error).
    pub fn new(scheme: Scheme, rate: f64) -> Self {
        Sketch {
            scheme,
            rate,
            chunks: None,
            rows: DctRows::First,
            seed: 0,
            lambda: 0.01,
            iterations: 100,
            error_feedback: scheme == Scheme::Cs,
        }
    }
}

fn codec(options: &Sketch, shapes: &[Vec<i64>], device: Device) -> Result<Codec> {
    let length: i64 = shapes.iter().map(|s| s.iter().product::<i64>()).sum();
    // The codec keeps m / n of the values: the paper's r = 1 / rate.
    Codec::new(
        options.scheme,
        length,
        1.0 / options.rate,
        options.chunks,
        options.rows,
        options.seed,
        device,
    )
}

/// A side's checkpointed state: its step counter (a 0-d tensor) and, when kept, its feedback
/// tensor under `name`.
pub(crate) fn counted_state(
    step: usize,
    name: &str,
    feedback: Option<&Tensor>,
) -> Vec<(String, Tensor)> {
    let mut state = vec![("step".to_string(), Tensor::from(step as i64))];
    if let Some(t) = feedback {
        state.push((name.to_string(), t.shallow_clone()));
    }
    state
}

/// Restores `counted_state`: copies the feedback tensor back in place and returns the step.
pub(crate) fn load_counted_state(
    mut state: HashMap<String, Tensor>,
    name: &str,
    feedback: Option<&mut Tensor>,
) -> Result<usize> {
    let step = crate::host::i64_scalar(&take_state(&mut state, "step", &[])?);
    if let Some(live) = feedback {
        let saved = take_state(&mut state, name, &live.size())?;
        tch::no_grad(|| live.copy_(&saved));
    }
    usize::try_from(step)
        .map_err(|_| Error::bad_value("compressor state", format!("step {step}: expected >= 0")))
}

/// The worker's side: compresses the flattened update with the step's sketch.
pub struct SketchEncoder {
    codec: Codec,
    step: usize,
    /// FL-RND with error feedback: the coordinates not yet sent, [n].
    residual: Option<Tensor>,
    device: Device,
}

impl SketchEncoder {
    /// An encoder for parameters of `shapes` (in the order the updates will come, sent as one
    /// flattened vector of n values), its sketch drawn from `options.seed` on `device`; FL-RND
    /// with `error_feedback` starts its residual at zero. An error when the sketch cannot be
    /// built (a rate below 1, or chunks P that do not fit n).
    pub fn new(shapes: &[Vec<i64>], device: Device, options: Sketch) -> Result<Self> {
        let codec = codec(&options, shapes, device)?;
        let residual = (options.error_feedback && options.scheme == Scheme::Rnd)
            .then(|| Tensor::zeros([codec.length], (Kind::Float, device)));
        Ok(SketchEncoder {
            codec,
            step: 0,
            residual,
            device,
        })
    }

    /// m, the values of every message.
    pub fn message_length(&self) -> i64 {
        self.codec.message_length()
    }

    /// The sketch (its chunks, m, the scheme).
    pub fn codec(&self) -> &Codec {
        &self.codec
    }
}

impl Encoder for SketchEncoder {
    fn set_step(&mut self, step: usize) {
        self.step = step;
    }

    fn encode(&mut self, update: &[Tensor]) -> Message {
        let round = self.codec.for_round(self.step, self.device);
        let values = match &mut self.residual {
            // Without a residual the flat update is not needed as such (`encode_parts`).
            None => round.encode_parts(update),
            Some(residual) => {
                let flat = flatten(update);
                let flat = &flat + residual.to_kind(flat.kind());
                let values = round.encode(&flat);
                *residual = (&flat - round.zero_fill(&values)).to_kind(residual.kind());
                values
            }
        };
        self.step += 1;
        Message::new(vec![Payload::Dense {
            values,
            value_bits: 32,
        }])
    }

    /// The sketches are linear and drawn from the shared seed, so W workers average them in
    /// the compressed domain by one all-reduce and the receiver decodes (FL-CS: reconstructs)
    /// the mean once, the federated paper's aggregation. FL-RND's residual is each worker's
    /// unsent coordinates, linear in its update too.
    fn encode_all_reduced(
        &mut self,
        update: &[Tensor],
        workers: usize,
        reduce: &mut AllReduce,
    ) -> Option<Result<Message>> {
        let message = self.encode(update);
        Some(mean_of_dense_messages(message, workers, reduce))
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        counted_state(self.step, "residual", self.residual.as_ref())
    }

    fn load_state(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
        self.step = load_counted_state(state, "residual", self.residual.as_mut())?;
        Ok(())
    }
}

/// The receiver's side: zero filling (FL-RND, FL-FREQ) or BPDN reconstruction with the error
/// kept in the compressed domain (FL-CS).
pub struct SketchDecoder {
    codec: Codec,
    options: Sketch,
    shapes: Vec<Vec<i64>>,
    step: usize,
    /// FL-CS with error feedback: e, [m].
    error: Option<Tensor>,
    device: Device,
}

impl SketchDecoder {
    /// A decoder for updates of parameters of `shapes`, with the same sketch as the encoders
    /// (the same `options`, so the same seed); FL-CS with `error_feedback` starts its error e
    /// \[m\] at zero. An error when the sketch cannot be built.
    pub fn new(shapes: &[Vec<i64>], device: Device, options: Sketch) -> Result<Self> {
        let codec = codec(&options, shapes, device)?;
        let error = (options.error_feedback && options.scheme == Scheme::Cs)
            .then(|| Tensor::zeros([codec.message_length()], (Kind::Float, device)));
        Ok(SketchDecoder {
            codec,
            options,
            shapes: shapes.to_vec(),
            step: 0,
            error,
            device,
        })
    }

    /// s = BPDN(y) per chunk, solved in f64 (the line search's sufficient-decrease test needs
    /// the precision), as the FL server solves it.
    fn reconstruct(&self, y: &Tensor) -> Tensor {
        let sketch = self.codec.sketch.as_ref().expect("FL-CS has a sketch");
        let measurements = sketch.measurements(y).to_kind(Kind::Double);
        let lambda = sketch
            .adjoint(&measurements)
            .abs()
            .amax([1i64].as_slice(), true)
            * self.options.lambda;
        let settings = OwlqnSettings {
            max_iterations: self.options.iterations,
            ..OwlqnSettings::default()
        };
        let solution = owlqn(
            sketch as &dyn Measurement,
            &measurements,
            &lambda,
            sketch.chunk_length,
            &settings,
        );
        sketch.unshuffle(&solution.s.to_kind(y.kind()))
    }
}

impl Decoder for SketchDecoder {
    fn set_step(&mut self, step: usize) {
        self.step = step;
    }

    fn decode(&mut self, message: &Message) -> Vec<Tensor> {
        let values = message.payloads[0].to_dense();
        let flat = match self.options.scheme {
            Scheme::Cs => match self.error.take() {
                Some(mut error) => {
                    error += values.to_kind(error.kind());
                    let s = self.reconstruct(&error);
                    error -= self.codec.sketch.as_ref().expect("FL-CS").compress(&s);
                    self.error = Some(error);
                    s.to_kind(values.kind())
                }
                None => self.reconstruct(&values),
            },
            _ => self
                .codec
                .for_round(self.step, self.device)
                .zero_fill(&values),
        };
        self.step += 1;
        split(&flat, &self.shapes)
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        counted_state(self.step, "error", self.error.as_ref())
    }

    fn load_state(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
        self.step = load_counted_state(state, "error", self.error.as_mut())?;
        Ok(())
    }
}
