//! Building descriptors from Parquet metadata, and checking files against them.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use arrow::array::Array;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::display::array_value_to_string;
use insitu_wire::{
    ColumnStats, Encoding, FieldFormat, FormatDescriptor, HybridLayout, LayoutKind, RowGroupStats,
    DESCRIPTOR_VERSION,
};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::parquet_to_arrow_schema;
use parquet::basic::Encoding as PqEncoding;
use parquet::file::metadata::ParquetMetaData;

use crate::{io_err, FormatError, FormatResult};

/// Describes a freshly written Parquet partition.
pub(crate) fn describe(
    table: &str,
    partition: u32,
    relative_file: &str,
    metadata: &ParquetMetaData,
    byte_size: u64,
    crc32: u32,
) -> FormatResult<FormatDescriptor> {
    let file_meta = metadata.file_metadata();
    let parquet_schema = file_meta.schema_descr();
    let pq_err = |source| FormatError::Parquet {
        path: relative_file.to_string(),
        source,
    };
    let schema =
        parquet_to_arrow_schema(parquet_schema, file_meta.key_value_metadata()).map_err(pq_err)?;
    let row_groups = metadata.row_groups();

    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut per_column_stats = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        let encodings: BTreeSet<Encoding> = row_groups
            .iter()
            .filter_map(|rg| rg.columns().get(i))
            .flat_map(|c| c.encodings().map(map_encoding).collect::<Vec<_>>())
            .collect();
        fields.push(FieldFormat {
            name: field.name().clone(),
            arrow_type: field.data_type().to_string(),
            width_bytes: field.data_type().primitive_width().map(|w| w as u32),
            nullable: field.is_nullable(),
            byte_order: "little".into(),
            encodings: encodings.into_iter().collect(),
            ipc_compression: None,
        });
        let converter =
            StatisticsConverter::try_new(field.name(), &schema, parquet_schema).map_err(pq_err)?;
        let mins = converter
            .row_group_mins(row_groups.iter())
            .map_err(pq_err)?;
        let maxes = converter
            .row_group_maxes(row_groups.iter())
            .map_err(pq_err)?;
        let nulls = converter
            .row_group_null_counts(row_groups.iter())
            .map_err(pq_err)?;
        per_column_stats.push((field.name().clone(), mins, maxes, nulls));
    }

    let render = |a: &arrow::array::ArrayRef, i: usize| {
        (i < a.len() && a.is_valid(i)).then(|| array_value_to_string(a, i).unwrap_or_default())
    };
    let row_groups = row_groups
        .iter()
        .enumerate()
        .map(|(rg, meta)| RowGroupStats {
            row_count: meta.num_rows() as u64,
            byte_size: meta.compressed_size() as u64,
            columns: per_column_stats
                .iter()
                .enumerate()
                .map(|(i, (name, mins, maxes, nulls))| ColumnStats {
                    column: name.clone(),
                    compressed_bytes: meta
                        .columns()
                        .get(i)
                        .map(|c| c.compressed_size().max(0) as u64),
                    min: render(mins, rg),
                    max: render(maxes, rg),
                    null_count: (rg < nulls.len() && nulls.is_valid(rg)).then(|| nulls.value(rg)),
                })
                .collect(),
        })
        .collect();

    Ok(FormatDescriptor {
        version: DESCRIPTOR_VERSION,
        table: table.to_string(),
        partition,
        file: relative_file.to_string(),
        layout: LayoutKind::Parquet,
        fields,
        row_count: file_meta.num_rows() as u64,
        byte_size,
        crc32,
        row_groups,
        hybrid: None,
        partitioning: None,
    })
}

/// Describes a freshly written hybrid partition.
#[allow(clippy::too_many_arguments)]
pub(crate) fn describe_hybrid(
    table: &str,
    partition: u32,
    relative_file: &str,
    layout: HybridLayout,
    row_count: u64,
    blocks: Vec<RowGroupStats>,
    byte_size: u64,
    crc32: u32,
    schema: &Schema,
) -> FormatResult<FormatDescriptor> {
    let fields = schema
        .fields()
        .iter()
        .map(|field| FieldFormat {
            name: field.name().clone(),
            arrow_type: field.data_type().to_string(),
            width_bytes: field.data_type().primitive_width().map(|w| w as u32),
            nullable: field.is_nullable(),
            byte_order: "little".into(),
            encodings: vec![Encoding::Plain],
            ipc_compression: None,
        })
        .collect();
    Ok(FormatDescriptor {
        version: DESCRIPTOR_VERSION,
        table: table.to_string(),
        partition,
        file: relative_file.to_string(),
        layout: LayoutKind::Hybrid,
        fields,
        row_count,
        byte_size,
        crc32,
        row_groups: blocks,
        hybrid: Some(layout),
        partitioning: None,
    })
}

fn map_encoding(e: PqEncoding) -> Encoding {
    match e {
        PqEncoding::PLAIN => Encoding::Plain,
        PqEncoding::PLAIN_DICTIONARY | PqEncoding::RLE_DICTIONARY => Encoding::Dictionary,
        PqEncoding::RLE => Encoding::Rle,
        PqEncoding::DELTA_BINARY_PACKED => Encoding::DeltaBinaryPacked,
        _ => Encoding::Other,
    }
}

/// Rebuilds the Arrow schema a descriptor describes.
pub fn schema_of(descriptor: &FormatDescriptor) -> FormatResult<Schema> {
    let fields = descriptor
        .fields
        .iter()
        .map(|f| {
            let data_type = DataType::from_str(&f.arrow_type).map_err(|e| {
                FormatError::Invalid(format!(
                    "table {} partition {}: field {} has unknown type '{}': {e}",
                    descriptor.table, descriptor.partition, f.name, f.arrow_type
                ))
            })?;
            Ok(Field::new(&f.name, data_type, f.nullable))
        })
        .collect::<FormatResult<Vec<_>>>()?;
    Ok(Schema::new(fields))
}

/// CRC32 (IEEE) and length of a whole file.
pub fn file_crc32(path: &Path) -> FormatResult<(u32, u64)> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hasher.finalize(), total))
}

/// Checks a partition file against its descriptor: size, then checksum.
pub fn verify_file(device: u32, device_dir: &Path, d: &FormatDescriptor) -> FormatResult<()> {
    let path = device_dir.join(&d.file);
    let (crc, size) = file_crc32(&path)?;
    if size != d.byte_size {
        return Err(FormatError::Size {
            device,
            table: d.table.clone(),
            partition: d.partition,
            path: path.display().to_string(),
            expected: d.byte_size,
            found: size,
        });
    }
    if crc != d.crc32 {
        return Err(FormatError::Checksum {
            device,
            table: d.table.clone(),
            partition: d.partition,
            path: path.display().to_string(),
            expected: d.crc32,
            found: crc,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::record_batch::RecordBatch;

    use super::*;
    use crate::{PartitionWriter, WriterOptions};

    fn batch(range: std::ops::Range<i64>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let keys = Int64Array::from_iter_values(range.clone());
        let strings =
            StringArray::from_iter(range.map(|i| (i % 3 != 0).then(|| format!("v{}", i % 5))));
        RecordBatch::try_new(schema, vec![Arc::new(keys), Arc::new(strings)]).unwrap()
    }

    #[test]
    fn descriptor_describes_the_file_and_detects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let options = WriterOptions {
            row_group_rows_max: 100,
            ..Default::default()
        };
        let b = batch(0..250);
        let mut w = PartitionWriter::create(dir.path(), "t", 7, b.schema(), &options).unwrap();
        w.write(&b).unwrap();
        let d = w.finish().unwrap();
        assert_eq!((d.row_count, d.row_groups.len()), (250, 3));
        assert_eq!(d.row_groups[2].columns[0].min.as_deref(), Some("200"));
        assert_eq!(d.row_groups[2].columns[0].max.as_deref(), Some("249"));
        assert!(d.fields[1].encodings.contains(&Encoding::Dictionary));
        assert_eq!(d.fields[0].width_bytes, Some(8));
        assert_eq!(schema_of(&d).unwrap(), *b.schema());
        verify_file(1, dir.path(), &d).unwrap();

        let path = dir.path().join(&d.file);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[40] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        let err = verify_file(1, dir.path(), &d).unwrap_err().to_string();
        assert!(
            err.contains("device 1") && err.contains("partition 7") && err.contains("checksum"),
            "{err}"
        );
    }

    #[test]
    fn abandoned_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let b = batch(0..10);
        let mut w =
            PartitionWriter::create(dir.path(), "t", 0, b.schema(), &WriterOptions::default())
                .unwrap();
        w.write(&b).unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path().join("t")).unwrap().count(), 0);
    }
}
