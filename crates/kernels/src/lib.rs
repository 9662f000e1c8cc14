//! Sort, shuffle and dictionary-decode kernels over Arrow arrays.
//!
//! The device side of a table sort (NASCENT2): sort the key column into
//! row indices, then gather whole rows by those indices. Every kernel is a
//! synchronous free function: no I/O, no async. The global state is
//! [`mem`]'s scratch pool, which retains freed large buffers for reuse
//! only when the process sets a limit (0 by default), and [`arena`]'s list
//! of live chunk arenas by address. Each one
//! asserts its preconditions (indices and dictionary keys in range) and is
//! tested against a naive reference in `tests/`.
//!
//! | kernel | what |
//! |---|---|
//! | [`argsort`], [`argsort_to`], [`argsort_top_k`] | one key column -> sorted row indices (radix) |
//! | [`argsort_columns`] | several key columns -> sorted row indices (row keys + radix) |
//! | [`dictionary_ranks`], [`sort_dictionary`] | generic sort of dictionary-encoded keys |
//! | [`gather`], [`gather_batch`], [`gather_rows`], [`gather_rows_into`], [`gather_values`] | shuffle by indices |
//! | [`GatherSource`] | shuffle of many batches by global indices, a chunk at a time, or all at once by scattering ([`GatherSource::scatter`]) |
//! | [`interleave_batches`] | rows of several batches by `(batch, row)`, as a merge copies short runs |
//! | [`dictionary_decode`], [`dictionary_decode_to_views`], [`DictionaryDecoder`] | dictionary codes -> plain values (or views into the dictionary); the decoder reuses per-dictionary tables across batches |
//! | [`validate_utf8_views`], [`validate_full_fast`] | checks of received string views |
//! | [`compact_views`] | string / binary views -> one buffer of just their bytes |
//! | [`dedup_view_buffers`] | string / binary views -> each buffer they reference listed once |
//! | [`shrink_views`] | string / binary views -> buffers of little more than they use, by either of the two above |
//! | [`arena::ChunkArena`] | one allocation for all of a batch's buffers, with room in front for a message header (encoded in place) |
//! | [`concat_views`] | string / binary view arrays -> one, buffers shared by consecutive parts listed once |

pub mod arena;
mod argsort;
mod argsort_columns;
mod decode;
mod dictionary;
mod gather;
mod gather_source;
mod interleave;
mod keys;
pub mod mem;
pub mod radix;
mod views;

pub use argsort::{argsort, argsort_to, argsort_top_k, key_images, KeyImage};
pub use argsort_columns::argsort_columns;
pub use decode::{dictionary_decode, dictionary_decode_to_views, DictionaryDecoder};
pub use dictionary::{
    dictionary_ranks, encode_views, key_mapping_table, low_cardinality_ranks, sort_dictionary,
    DictionaryRanks,
};
pub use gather::{
    gather, gather_batch, gather_batch_with, gather_rows, gather_rows_into, gather_values,
    prefetch, ROW_GROUP_BYTES_MAX,
};
pub use gather_source::{concat_views, widens_to, GatherSource, ScatteredBatches, SourceLayout};
pub use interleave::interleave_batches;
pub use radix::SortIndex;
pub use views::{
    compact_views, dedup_view_buffers, shrink_views, validate_full_fast, validate_utf8_views,
    SHRINK_SLACK_BYTES,
};

/// How many threads a kernel may use; 1 by default.
#[derive(Debug, Clone, Copy)]
pub struct Parallelism(pub usize);

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism(1)
    }
}
