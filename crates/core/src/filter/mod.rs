//! The Bloom filter of keys that exist: a cache-line-blocked filter ([`bloom`]) per time window, windows
//! rotated and grown by [`windowed`]. It answers "definitely not added within retention" or "maybe added".

pub mod bloom;
mod memory;
pub mod windowed;

pub use bloom::{BloomLayer, Geometry, LayerWriter, MAX_LAYER_BYTES};
pub use memory::mapped_bytes;
pub use windowed::{FilterSpec, FilterStats, Retention, WindowedFilter};
