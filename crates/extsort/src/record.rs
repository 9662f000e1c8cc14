//! TeraSort records: generation (`gensort`) and validation (`valsort`).
//!
//! The public gensort record format, 100 bytes each:
//!
//! ```text
//! binary: | key 10 (random bytes) | 00 11 | row id, 32 hex digits | 88 99 AA BB | filler 48 | CC DD EE FF |
//! ascii:  | key 10 (printable)    | "  "  | row id, 32 hex digits | "  "        | filler 52 | "\r\n"      |
//! ```
//!
//! The validation checksum is the gensort/valsort one: the sum of every
//! record's CRC32, as a 128-bit number, so it is the same for any order of
//! the same multiset of records.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::files::{io_err, AtomicFile};
use crate::{ExtsortError, Result};

/// Bytes of one TeraSort record.
pub const RECORD_BYTES: usize = 100;
/// Bytes of its key, at the start of the record.
pub const KEY_BYTES: usize = 10;

/// Distinct keys a skewed input draws from (`--skew`).
const SKEW_KEYS: u64 = 1024;

/// What `gensort` writes.
#[derive(Debug, Clone, Copy)]
pub struct GenOptions {
    pub records: u64,
    /// Printable keys and a line ending per record (sortable with `sort`).
    pub ascii: bool,
    pub seed: u64,
    /// Keys from a small, skewed set: many duplicates, a few very common.
    pub skew: bool,
}

/// A 64-bit mix of `x` (splitmix64's finalizer): independent-looking
/// values from consecutive inputs, so any record can be generated alone.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Writes record `row` into `out` (exactly [`RECORD_BYTES`] long).
pub fn fill_record(out: &mut [u8], row: u64, options: &GenOptions) {
    assert_eq!(out.len(), RECORD_BYTES, "one record");
    let key_source = if options.skew {
        // u^4 on [0, 1): most rows land on the first few of SKEW_KEYS keys.
        let u = (mix(options.seed ^ row.rotate_left(17)) >> 11) as f64 / (1u64 << 53) as f64;
        (u.powi(4) * SKEW_KEYS as f64) as u64
    } else {
        row
    };
    let (a, b) = (
        mix(options.seed.wrapping_mul(31) ^ key_source),
        mix(options.seed.wrapping_mul(37) ^ key_source ^ 0xA5A5),
    );
    let mut key = [0u8; KEY_BYTES];
    key[..8].copy_from_slice(&a.to_be_bytes());
    key[8..].copy_from_slice(&b.to_be_bytes()[..2]);
    if options.ascii {
        for k in key.iter_mut() {
            *k = b' ' + (*k % 95);
        }
    }
    out[..KEY_BYTES].copy_from_slice(&key);
    let sep: [u8; 2] = if options.ascii { *b"  " } else { [0x00, 0x11] };
    out[10..12].copy_from_slice(&sep);
    for (i, o) in out[12..44].iter_mut().enumerate() {
        let shift = 4 * (31 - i);
        *o = if shift < 64 {
            HEX[((row >> shift) & 0xf) as usize]
        } else {
            b'0'
        };
    }
    let filler = mix(row ^ 0xF111);
    if options.ascii {
        out[44..46].copy_from_slice(b"  ");
        for (g, chunk) in out[46..98].chunks_mut(4).enumerate() {
            chunk.fill(HEX[((filler >> (4 * (g % 16))) & 0xf) as usize]);
        }
        out[98..100].copy_from_slice(b"\r\n");
    } else {
        out[44..48].copy_from_slice(&[0x88, 0x99, 0xAA, 0xBB]);
        for (g, chunk) in out[48..96].chunks_mut(4).enumerate() {
            chunk.fill(HEX[((filler >> (4 * (g % 16))) & 0xf) as usize]);
        }
        out[96..100].copy_from_slice(&[0xCC, 0xDD, 0xEE, 0xFF]);
    }
}

/// Writes `options.records` records to `path` (temp file, fsync, rename).
/// `progress` gets the records written since its last call.
pub fn gensort(path: &Path, options: &GenOptions, progress: &dyn Fn(u64)) -> Result<()> {
    const BLOCK_RECORDS: u64 = 40_000; // 4 MB per write
    let mut out = AtomicFile::create(path)?;
    let mut block = vec![0u8; BLOCK_RECORDS as usize * RECORD_BYTES];
    let mut row = 0u64;
    while row < options.records {
        let n = BLOCK_RECORDS.min(options.records - row);
        for (i, record) in block[..n as usize * RECORD_BYTES]
            .chunks_exact_mut(RECORD_BYTES)
            .enumerate()
        {
            fill_record(record, row + i as u64, options);
        }
        out.write_all(&block[..n as usize * RECORD_BYTES])?;
        row += n;
        progress(n);
    }
    out.commit()
}

/// What `valsort` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validation {
    pub records: u64,
    /// Records whose key equals the previous record's key.
    pub duplicate_keys: u64,
    /// Sum of the records' CRC32s.
    pub checksum: u128,
    /// Records whose key is smaller than the previous record's.
    pub unordered: u64,
    /// Index of the first such record.
    pub first_unordered: Option<u64>,
}

impl Validation {
    pub fn sorted(&self) -> bool {
        self.unordered == 0
    }
}

/// Checks that `path` holds whole records in key order, counting them,
/// their duplicate keys and their checksum. `progress` gets bytes read.
pub fn valsort(
    path: &Path,
    record_size: usize,
    key_size: usize,
    progress: &dyn Fn(u64),
) -> Result<Validation> {
    check_shape(record_size, key_size)?;
    let file = File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    check_whole_records(path, len, record_size)?;
    let mut reader = BufReader::with_capacity(4 << 20, file);
    let mut block = vec![0u8; (4 << 20) / record_size * record_size];
    let mut prev = vec![0u8; key_size];
    let mut v = Validation {
        records: 0,
        duplicate_keys: 0,
        checksum: 0,
        unordered: 0,
        first_unordered: None,
    };
    let mut left = len;
    while left > 0 {
        let n = (block.len() as u64).min(left) as usize;
        reader.read_exact(&mut block[..n]).map_err(io_err(path))?;
        for record in block[..n].chunks_exact(record_size) {
            let key = &record[..key_size];
            if v.records > 0 {
                match key.cmp(&prev[..]) {
                    std::cmp::Ordering::Less => {
                        v.unordered += 1;
                        v.first_unordered.get_or_insert(v.records);
                    }
                    std::cmp::Ordering::Equal => v.duplicate_keys += 1,
                    std::cmp::Ordering::Greater => {}
                }
            }
            prev.copy_from_slice(key);
            v.checksum += u128::from(crc32fast::hash(record));
            v.records += 1;
        }
        left -= n as u64;
        progress(n as u64);
    }
    Ok(v)
}

/// Rejects record and key sizes that cannot describe records.
pub fn check_shape(record_size: usize, key_size: usize) -> Result<()> {
    if record_size == 0 || key_size == 0 || key_size > record_size {
        return Err(ExtsortError::Invalid(format!(
            "--key-size {key_size} must be between 1 and --record-size {record_size}"
        )));
    }
    Ok(())
}

/// Rejects an input that is not a whole number of records.
pub fn check_whole_records(path: &Path, len: u64, record_size: usize) -> Result<()> {
    if !len.is_multiple_of(record_size as u64) {
        return Err(ExtsortError::Input {
            path: path.display().to_string(),
            message: format!(
                "{len} bytes is not a whole number of {record_size}-byte records \
                 ({} records and {} bytes left over)",
                len / record_size as u64,
                len % record_size as u64
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_follow_the_gensort_layout() {
        let mut r = [0u8; RECORD_BYTES];
        let opts = GenOptions {
            records: 1,
            ascii: false,
            seed: 1,
            skew: false,
        };
        fill_record(&mut r, 0x1234, &opts);
        assert_eq!(&r[10..12], &[0x00, 0x11]);
        assert_eq!(&r[12..44], b"00000000000000000000000000001234");
        assert_eq!(&r[44..48], &[0x88, 0x99, 0xAA, 0xBB]);
        assert_eq!(&r[96..], &[0xCC, 0xDD, 0xEE, 0xFF]);
        let ascii = GenOptions {
            ascii: true,
            ..opts
        };
        fill_record(&mut r, 7, &ascii);
        assert!(r[..KEY_BYTES].iter().all(|b| (b' '..=b'~').contains(b)));
        assert_eq!(&r[10..12], b"  ");
        assert_eq!(&r[98..], b"\r\n");
        assert!(r[..98]
            .iter()
            .all(|b| b.is_ascii() && !b.is_ascii_control()));
    }

    #[test]
    fn gensort_then_valsort_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in");
        for (skew, ascii) in [(false, false), (true, true)] {
            let opts = GenOptions {
                records: 10_001,
                ascii,
                seed: 9,
                skew,
            };
            gensort(&path, &opts, &|_| {}).unwrap();
            let v = valsort(&path, RECORD_BYTES, KEY_BYTES, &|_| {}).unwrap();
            assert_eq!(v.records, 10_001);
            assert!(!v.sorted(), "random keys are not sorted");
            // Sort the records naively and check again: same checksum.
            let bytes = std::fs::read(&path).unwrap();
            let mut records: Vec<&[u8]> = bytes.chunks(RECORD_BYTES).collect();
            records.sort_by_key(|r| &r[..KEY_BYTES]);
            let distinct = {
                let mut keys: Vec<&[u8]> = records.iter().map(|r| &r[..KEY_BYTES]).collect();
                keys.dedup();
                keys.len() as u64
            };
            std::fs::write(&path, records.concat()).unwrap();
            let s = valsort(&path, RECORD_BYTES, KEY_BYTES, &|_| {}).unwrap();
            assert!(s.sorted());
            assert_eq!(s.checksum, v.checksum);
            assert_eq!(s.duplicate_keys, 10_001 - distinct);
            if skew {
                assert!(s.duplicate_keys > 9_000, "{}", s.duplicate_keys);
            }
        }
        std::fs::write(&path, [0u8; 250]).unwrap();
        let err = valsort(&path, RECORD_BYTES, KEY_BYTES, &|_| {})
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("250 bytes") && err.contains("100-byte records"),
            "{err}"
        );
    }
}
