//! How the W workers of a data-parallel run combine their compressed updates into one. Every
//! worker encodes its own update with its own encoder (its own error feedback), and
//! real messages cross the transport (`comm::Communicator`):
//!
//! - linear compressors (dense fp32, PowerSGD, the federated sketches) by all-reduce:
//!   `Encoder::encode_all_reduced` (PowerSGD as PyTorch's `powerSGD_hook`: all-reduce P,
//!   orthonormalise, all-reduce Q; the sketches averaged in the compressed domain and decoded
//!   once, FL-CS's reconstruction included, as the federated paper's server does);
//! - the others (DGC, top-k, Denoise) by all-gather of each worker's exact bytes
//!   (`compress::wire`): through host memory for MPI and the thread transport, and where the
//!   tensors live for c10d (`Communicator::moves_tensors`: the bytes made and read on the
//!   device by `compress::wire_on_device`, padded to the longest for one all-gather), every worker decoding all W messages with one decoder per sender
//!   (Denoise's receiver keeps a velocity per sender) and averaging them in rank order.
//!
//! Either way every worker ends with the same update, the mean of the W decoded updates, so the
//! weights stay equal on every worker without being sent again.

use crate::comm::staging::HostStaging;
use crate::comm::{Communicator, Traffic};
use crate::compress::{wire_on_device, Decoder, Encoder, Message};
use crate::error::Result;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// What one step's exchange cost this worker.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTraffic {
    /// Bytes this worker handed to the transport and received from it (`Communicator::take_traffic`).
    pub traffic: Traffic,
    /// Seconds spent encoding (PowerSGD: its matrix products between the two all-reduces).
    pub encode_seconds: f64,
    /// Seconds inside the collectives (waiting for the slowest worker included).
    pub comm_seconds: f64,
    /// Seconds decoding the gathered messages and averaging them.
    pub decode_seconds: f64,
}

/// One step's combined update.
pub struct Exchanged {
    /// The mean of the W workers' decoded updates, on the gradients' device.
    pub update: Vec<Tensor>,
    /// Bits of this worker's own message as handed to the transport: 8 x its bytes when
    /// gathered, 32 x the values it all-reduced when linear (what `StepTraffic::traffic.sent`
    /// counts, with W > 1).
    pub bits: u64,
    /// This worker's message in the paper's unit (`Message::paper_bits`).
    pub paper_bits: u64,
    /// What the exchange cost this worker: bytes through the transport and the seconds of each
    /// phase.
    pub cost: StepTraffic,
}

/// Every worker's message of one step, read, with what it cost so far.
struct Gathered {
    /// The W messages in rank order.
    messages: Vec<Message>,
    /// Bits of this worker's message as handed to the transport (8 x its bytes).
    bits: u64,
    encode_seconds: f64,
    comm_seconds: f64,
    /// When reading the messages began (decoding counts from there).
    decode_started: Instant,
}

/// A worker's end of the exchange: the transport and one decoder per sender.
pub struct Exchange {
    /// The transport to the other workers (threads or MPI ranks); its rank and size are this
    /// worker's and W.
    pub comm: Box<dyn Communicator>,
    /// Decoders of the gathered messages, one per sender in rank order.
    pub decoders: Vec<Box<dyn Decoder>>,
    /// Bytes of collectives outside the steps' exchanges (identity checks, the epoch's metrics,
    /// checkpoints) since the last `take_control`.
    control: Traffic,
    /// Reusable (pinned, on a GPU) host buffers for the messages and the all-reduced vectors.
    staging: HostStaging,
}

impl Exchange {
    /// `decoders` must hold one decoder per rank of `comm`, built from the same compressor.
    pub fn new(comm: Box<dyn Communicator>, decoders: Vec<Box<dyn Decoder>>) -> Self {
        assert_eq!(
            decoders.len(),
            comm.size(),
            "one decoder per sender of the exchange"
        );
        Exchange {
            comm,
            decoders,
            control: Traffic::default(),
            staging: HostStaging::new(),
        }
    }

    /// This exchange with `staging` for the host buffers (`HostStaging::always()` runs the
    /// buffers' path on the CPU, as the tests do).
    pub fn with_staging(mut self, staging: HostStaging) -> Self {
        self.staging = staging;
        self
    }

    /// The host buffers the messages and all-reduced vectors go through.
    pub fn staging(&self) -> &HostStaging {
        &self.staging
    }

    /// W, the number of workers taking part (the transport's size).
    pub fn workers(&self) -> usize {
        self.comm.size()
    }

    /// Bytes of the collectives run outside the steps' exchanges since the last call.
    pub fn take_control(&mut self) -> Traffic {
        self.control += self.comm.take_traffic();
        std::mem::take(&mut self.control)
    }

    /// Encodes `grads` with this worker's `encoder`, exchanges the messages with every other
    /// worker and returns the mean of the W decoded updates.
    pub fn exchange(&mut self, encoder: &mut dyn Encoder, grads: &[Tensor]) -> Result<Exchanged> {
        self.control += self.comm.take_traffic();
        let workers = self.workers();
        let started = Instant::now();
        let mut comm_seconds = 0.0;
        let (comm, staging) = (&mut self.comm, &mut self.staging);
        let mut reduce = |flat: &Tensor| -> Result<Tensor> {
            let at = Instant::now();
            let result = if comm.moves_tensors() {
                // Summed where it lives, in place: the vector is made for the call
                // (`compress::AllReduce`), so no copy of it is needed.
                let mut sum = flat.to_kind(Kind::Float).reshape([-1]).contiguous();
                comm.all_reduce_tensor(&mut sum).map(|()| sum)
            } else {
                staging.all_reduce(comm.as_mut(), flat)
            };
            comm_seconds += at.elapsed().as_secs_f64();
            result
        };
        if let Some(message) = encoder.encode_all_reduced(grads, workers, &mut reduce) {
            let message = message?;
            let encode_seconds = started.elapsed().as_secs_f64() - comm_seconds;
            let at = Instant::now();
            // One message, the same on every worker: the first decoder reads it (dense and
            // PowerSGD statelessly, a sketch's receiver with its error in the compressed domain).
            let update: Vec<Tensor> = tch::no_grad(|| {
                let decoded = self.decoders[0].decode(&message);
                self.decoders[0].combine(decoded)
            });
            let cost = StepTraffic {
                traffic: self.comm.take_traffic(),
                encode_seconds,
                comm_seconds,
                decode_seconds: at.elapsed().as_secs_f64(),
            };
            return Ok(Exchanged {
                update,
                bits: 32 * message.elements(),
                paper_bits: message.paper_bits(),
                cost,
            });
        }
        let message = encoder.encode(grads);
        let device = grads.first().map_or(Device::Cpu, Tensor::device);
        let gathered = if self.comm.moves_tensors() && !message.has_pending_size() {
            self.gather_on_device(&message, started)?
        } else {
            self.gather_through_host(&message, started, device)?
        };
        let mut sum: Option<Vec<Tensor>> = None;
        for (received, decoder) in gathered.messages.iter().zip(&mut self.decoders) {
            let part = decoder.decode(received);
            sum = Some(match sum {
                None => part,
                Some(total) => total.iter().zip(&part).map(|(t, p)| t + p).collect(),
            });
        }
        let mean = sum
            .expect("an all-gather returns one message per rank")
            .into_iter()
            .map(|t| t / workers as f64)
            .collect();
        // signSGD's majority vote: the sign of the mean (`Decoder::combine`).
        let update = self.decoders[0].combine(mean);
        let cost = StepTraffic {
            traffic: self.comm.take_traffic(),
            encode_seconds: gathered.encode_seconds,
            comm_seconds: gathered.comm_seconds,
            decode_seconds: gathered.decode_started.elapsed().as_secs_f64(),
        };
        Ok(Exchanged {
            update,
            bits: gathered.bits,
            paper_bits: message.paper_bits(),
            cost,
        })
    }

    /// Every worker's message through host memory (MPI, the thread transport; and a message
    /// whose size depends on its values): every tensor's copy is queued, the host waits once,
    /// and that one transfer is the step's one counted read (`host::one_transfer`); the exact
    /// bytes are all-gathered. The messages in rank order, the bits of this worker's, the
    /// seconds encoding and in the collective.
    fn gather_through_host(
        &mut self,
        message: &Message,
        started: Instant,
        device: Device,
    ) -> Result<Gathered> {
        let bytes = self.staging.message_bytes(message)?;
        let encode_seconds = started.elapsed().as_secs_f64();
        let at = Instant::now();
        let gathered = self.comm.all_gather(&bytes)?;
        let comm_seconds = at.elapsed().as_secs_f64();
        let decode_started = Instant::now();
        let messages = gathered
            .iter()
            .enumerate()
            .map(|(sender, bytes)| {
                Message::from_bytes(bytes, device).map_err(|e| {
                    self.comm.error(format!(
                        "the message rank {sender} sent does not decode: {e}"
                    ))
                })
            })
            .collect::<Result<Vec<Message>>>()?;
        Ok(Gathered {
            messages,
            bits: 8 * bytes.len() as u64,
            encode_seconds,
            comm_seconds,
            decode_started,
        })
    }

    /// Every worker's message where the tensors live (c10d, `Communicator::moves_tensors`):
    /// the bytes are made on the device (`wire_on_device`), the layouts and lengths cross
    /// through the transport's host collectives (the shapes fix them: nothing is read from the
    /// device), and the bytes, padded to the longest, by one all-gather of device memory
    /// (Gloo gathers tensors of one length), each trimmed back and read on the device.
    fn gather_on_device(&mut self, message: &Message, started: Instant) -> Result<Gathered> {
        let mine = wire_on_device::encode(message)?;
        let length = mine.bytes.size()[0];
        let encode_seconds = started.elapsed().as_secs_f64();
        let at = Instant::now();
        let mut head = (length as u64).to_le_bytes().to_vec();
        head.extend_from_slice(&mine.layout);
        let heads = self.comm.all_gather(&head)?;
        let lengths = heads
            .iter()
            .enumerate()
            .map(|(sender, head)| match head.get(..8) {
                Some(b) => Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")) as i64),
                None => Err(self.comm.error(format!(
                    "rank {sender} sent a layout of {} bytes: expected at least 8",
                    head.len()
                ))),
            })
            .collect::<Result<Vec<i64>>>()?;
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let padded = match longest - length {
            0 => mine.bytes,
            pad => Tensor::cat(
                &[
                    mine.bytes.shallow_clone(),
                    Tensor::zeros([pad], (Kind::Uint8, mine.bytes.device())),
                ],
                0,
            ),
        };
        let gathered = self.comm.all_gather_tensor(&padded)?;
        let comm_seconds = at.elapsed().as_secs_f64();
        let decode_started = Instant::now();
        let messages = gathered
            .iter()
            .zip(&heads)
            .zip(&lengths)
            .enumerate()
            .map(|(sender, ((bytes, head), &n))| {
                wire_on_device::decode(&head[8..], &bytes.narrow(0, 0, n)).map_err(|e| {
                    self.comm.error(format!(
                        "the message rank {sender} sent does not decode: {e}"
                    ))
                })
            })
            .collect::<Result<Vec<Message>>>()?;
        Ok(Gathered {
            messages,
            bits: 8 * length as u64,
            encode_seconds,
            comm_seconds,
            decode_started,
        })
    }
}
