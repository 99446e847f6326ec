//! Gradient compressors: what one worker puts on the wire for its update, and how the receiver
//! turns it back into an update (Lin 2022, "On the Interaction Between Differential Privacy and Gradient Compression in Deep Learning", its
//! "gradient compression" sections; GRACE's compressor/memory split).
//!
//! In training the order is clip -> noise -> **compress -> decompress** -> optimiser step
//! (`train::Updater`): compression is post-processing of the already-noisy gradient and never
//! changes ε. A compressor is two objects with separate state: the worker's `Encoder`
//! (residuals, momentum, warm-start factors) and the receiver's `Decoder` (Denoise's velocity;
//! the others decode statelessly), exchanging a `Message` that `wire` turns into bytes. Both are
//! allocated from the parameters' shapes (`Compressor::encoder` / `decoder` / `link`) and
//! saved in every checkpoint (`Link::state`, names `encoder.*` / `decoder.*`). All tensor work
//! stays on the gradients' device.
//!
//! `codec` holds what every compressor shares (the traits, `Link`, `Scope`); `compressor` the
//! typed choice (`Compressor`), `kind` its name, and `settings` its TOML form, which a run's
//! `[compression]` table and the `--compressor-option` flags give.

pub mod cast;
pub mod chunked_dct;
pub mod codec;
pub mod compressor;
pub mod dct;
pub mod denoise;
pub mod dgc;
pub(crate) mod elementwise;
pub mod elias;
pub mod encoding;
pub mod identity;
pub mod kind;
pub mod linear_sketch;
pub mod message;
pub mod natural;
pub mod owlqn;
pub mod powersgd;
pub mod qsgd;
pub mod random_k;
pub mod settings;
pub mod sign;
pub mod sketched;
pub mod terngrad;
pub mod threshold;
pub mod topk;
pub mod unpack;
pub mod wire;
pub mod wire_on_device;

pub use cast::{Cast, CastEncoder, Int8, Int8Encoder};
pub(crate) use codec::clip_global_norm;
pub use codec::{
    all_reduce_sum, dense_fp32_bits, flatten, split, AllReduce, Decoder, Encoder, Link, Scope,
    DECODER_PREFIX, ENCODER_PREFIX,
};
pub use compressor::Compressor;
pub use denoise::{Denoise, DenoiseDecoder, DenoiseEncoder};
pub use dgc::{Dgc, DgcEncoder};
pub use identity::DenseEncoder;
pub use kind::CompressorKind;
pub use message::{LevelCode, Message, Payload};
pub use natural::NaturalEncoder;
pub use powersgd::{PowerSgd, PowerSgdEncoder};
pub use qsgd::{Qsgd, QsgdEncoder, QsgdEncoding};
pub use random_k::{RandomK, RandomKDecoder, RandomKEncoder};
pub use settings::Setting;
pub use sign::{EfSignEncoder, MajorityVote, SignEncoder};
pub use sketched::{Sketch, SketchDecoder, SketchEncoder};
pub use terngrad::TernGradEncoder;
pub use threshold::{Threshold, ThresholdEncoder};
pub use unpack::Unpack;
