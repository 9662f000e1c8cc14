//! Validation of string views received from elsewhere.
//!
//! Arrow's own check (`validate_string_view` in arrow-data, which `ArrayData::validate_values` calls) runs
//! `from_utf8` on every view's bytes, one call per row. A data buffer that
//! holds only whole strings (what a compacted `StringViewArray` holds) is
//! valid UTF-8 as a whole, so one pass over each buffer plus a
//! char-boundary test at both ends of each view proves the same thing:
//! a slice of valid UTF-8 that starts and ends on char boundaries is valid
//! UTF-8. Buffers that fail the whole-buffer pass (garbage between strings
//! is legal) fall back to the per-view check.

use arrow::array::ArrayData;
use arrow::datatypes::DataType;
use arrow::error::ArrowError;

/// Longest string stored inside its view.
const INLINE_BYTES_MAX: u32 = 12;

/// Checks `views` against `buffers` as a `Utf8View` array: inline strings
/// are UTF-8 with zeroed padding, out-of-line views name an existing
/// buffer, lie inside it, carry their string's first four bytes as prefix,
/// and cover valid UTF-8. It accepts exactly what Arrow's
/// `validate_string_view` accepts, faster when the buffers hold only
/// whole strings.
///
/// ```
/// # use arrow::array::{Array, StringViewArray};
/// # use insitu_kernels::validate_utf8_views;
/// let a = StringViewArray::from(vec!["short", "a string longer than twelve bytes"]);
/// assert!(validate_utf8_views(a.views(), a.data_buffers()).is_ok());
/// ```
pub fn validate_utf8_views(
    views: &[u128],
    buffers: &[arrow::buffer::Buffer],
) -> Result<(), ArrowError> {
    let whole_utf8: Vec<bool> = buffers
        .iter()
        .map(|b| std::str::from_utf8(b).is_ok())
        .collect();
    for (idx, &view) in views.iter().enumerate() {
        let len = view as u32;
        let checked = if len <= INLINE_BYTES_MAX {
            check_inline(view, len)
        } else {
            check_out_of_line(view, len, buffers, &whole_utf8)
        };
        if let Err(what) = checked {
            return Err(ArrowError::InvalidArgumentError(format!(
                "string view at index {idx}: {what}"
            )));
        }
    }
    Ok(())
}

/// What `ArrayData::validate_full` checks (structure, null counts,
/// values, recursively through children), with string views checked by
/// [`validate_utf8_views`].
pub fn validate_full_fast(data: &ArrayData) -> Result<(), ArrowError> {
    data.validate()?;
    data.validate_nulls()?;
    if data.data_type() == &DataType::Utf8View {
        let views = &data.buffer::<u128>(0)[..data.len()];
        validate_utf8_views(views, &data.buffers()[1..])?;
    } else {
        data.validate_values()?;
    }
    data.child_data().iter().try_for_each(validate_full_fast)
}

fn check_inline(view: u128, len: u32) -> Result<(), &'static str> {
    if len < INLINE_BYTES_MAX && (view >> (32 + len * 8)) != 0 {
        return Err("non-zero padding after an inline string");
    }
    // Padding is zero, so all-ASCII is one mask test over the 12 bytes.
    let ascii = (view >> 32) & 0x8080_8080_8080_8080_8080_8080 == 0;
    let bytes = view.to_le_bytes();
    if ascii || std::str::from_utf8(&bytes[4..4 + len as usize]).is_ok() {
        Ok(())
    } else {
        Err("inline string is not UTF-8")
    }
}

fn check_out_of_line(
    view: u128,
    len: u32,
    buffers: &[arrow::buffer::Buffer],
    whole_utf8: &[bool],
) -> Result<(), &'static str> {
    let index = (view >> 64) as u32 as usize;
    let start = (view >> 96) as u32 as usize;
    let end = start + len as usize;
    let buffer = buffers.get(index).ok_or("buffer index out of range")?;
    let s = buffer
        .get(start..end)
        .ok_or("string runs past its buffer")?;
    if s[..4] != ((view >> 32) as u32).to_le_bytes() {
        return Err("prefix does not match the string");
    }
    let utf8 = if whole_utf8[index] {
        is_char_boundary(buffer, start) && is_char_boundary(buffer, end)
    } else {
        std::str::from_utf8(s).is_ok()
    };
    utf8.then_some(()).ok_or("string is not UTF-8")
}

/// Whether `at` is a char boundary of UTF-8 `bytes` (their end counts).
fn is_char_boundary(bytes: &[u8], at: usize) -> bool {
    // Continuation bytes are 0b10xxxxxx, i.e. -64..-1 as i8.
    bytes.get(at).is_none_or(|&b| (b as i8) >= -0x40)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;
    use arrow::buffer::Buffer;

    fn view(len: u32, prefix: [u8; 4], buffer: u32, offset: u32) -> u128 {
        len as u128
            | (u32::from_le_bytes(prefix) as u128) << 32
            | (buffer as u128) << 64
            | (offset as u128) << 96
    }

    #[test]
    fn accepts_what_arrow_builds() {
        let a = StringViewArray::from(vec!["", "ascii", "ünïcödé strings, long ones", "≈"]);
        validate_utf8_views(a.views(), a.data_buffers()).unwrap();
    }

    #[test]
    fn rejects_a_view_that_splits_a_char() {
        // "aaaaaaaaaaaaé" is 13 ASCII bytes then a 2-byte char; a view of 14
        // bytes ends inside it.
        let buffer = Buffer::from("aaaaaaaaaaaaaé".as_bytes());
        let ok = view(15, *b"aaaa", 0, 0);
        let split = view(14, *b"aaaa", 0, 0);
        validate_utf8_views(&[ok], std::slice::from_ref(&buffer)).unwrap();
        let err = validate_utf8_views(&[ok, split], &[buffer]).unwrap_err();
        assert!(
            err.to_string().contains("index 1: string is not UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn checks_each_view_when_its_buffer_is_not_all_utf8() {
        // Bytes no view covers may be anything, here a lone 0xff.
        let buffer = Buffer::from(b"0123456789abcd\xff".as_slice());
        validate_utf8_views(&[view(14, *b"0123", 0, 0)], std::slice::from_ref(&buffer)).unwrap();
        validate_utf8_views(&[view(15, *b"0123", 0, 0)], &[buffer]).unwrap_err();
    }

    #[test]
    fn rejects_bad_structure() {
        let buffer = Buffer::from("0123456789abcdefgh".as_bytes());
        let cases = [
            view(13, *b"0123", 1, 0), // no buffer 1
            view(13, *b"0123", 0, 6), // runs past the end
            view(13, *b"x123", 0, 0), // wrong prefix
            1 | (0xffu128 << 40),     // inline padding not zero
            2 | (0xc3u128 << 32),     // inline string not UTF-8
        ];
        for v in cases {
            assert!(validate_utf8_views(&[v], std::slice::from_ref(&buffer)).is_err());
        }
    }
}
