//! The results tables as CSV files (`results.csv` of every kind of grid, `gradient_error.csv`,
//! `clipping.csv`), written and read with the `csv` crate: a field that holds a comma, such as
//! the compressor label `denoise x1 (budget=elements, clip=3.0, scope=model)`, is quoted instead
//! of splitting its row into more fields than the header has.

use dpcomp::error::{Error, Result};
use std::path::Path;

/// Writes `header` and `rows` to `path` (replacing it), quoting the fields that need it. Every
/// row must have one field per header column.
pub fn write(path: &Path, header: &[&str], rows: &[Vec<String>]) -> Result<()> {
    for (i, row) in rows.iter().enumerate() {
        if row.len() != header.len() {
            return Err(Error::bad_file(
                path,
                format!(
                    "row {}: {} fields, expected one per header column ({})",
                    i + 1,
                    row.len(),
                    header.len()
                ),
            ));
        }
    }
    let bad = |e: csv::Error| Error::bad_file(path, format!("writing CSV: {e}"));
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(header).map_err(bad)?;
    for row in rows {
        writer.write_record(row).map_err(bad)?;
    }
    let bytes = writer
        .into_inner()
        .map_err(|e| Error::bad_file(path, format!("writing CSV: {e}")))?;
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// The header and rows of the CSV file at `path`; an error names the file and the record whose
/// number of fields differs from the header's.
pub fn read(path: &Path) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = csv::Reader::from_reader(file);
    let bad = |e: csv::Error| {
        Error::bad_file(
            path,
            format!("{e}: expected CSV with one field per header column"),
        )
    };
    let header = reader
        .headers()
        .map_err(bad)?
        .iter()
        .map(str::to_string)
        .collect();
    let mut rows = Vec::new();
    for record in reader.records() {
        rows.push(record.map_err(bad)?.iter().map(str::to_string).collect());
    }
    Ok((header, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A label with commas and quotes is quoted on the way out and comes back whole.
    #[test]
    fn labels_with_commas_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.csv");
        let label = "denoise x1 (budget=elements, clip=3.0, scope=model)";
        let quoted = "the \"paper's\" unit, 64 bits";
        let rows = vec![
            vec!["a".to_string(), label.to_string(), "0.5".to_string()],
            vec!["b".to_string(), quoted.to_string(), String::new()],
        ];
        write(&path, &["cell", "compressor", "final_accuracy"], &rows).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "cell,compressor,final_accuracy\n\
             a,\"denoise x1 (budget=elements, clip=3.0, scope=model)\",0.5\n\
             b,\"the \"\"paper's\"\" unit, 64 bits\",\n"
        );
        let (header, back) = read(&path).unwrap();
        assert_eq!(header, ["cell", "compressor", "final_accuracy"]);
        assert_eq!(back, rows);
    }

    /// A row with the wrong number of fields is refused, naming the file; so is a file with one.
    #[test]
    fn rows_of_the_wrong_width_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.csv");
        let e = write(&path, &["a", "b"], &[vec!["1".to_string()]]).unwrap_err();
        assert!(e.to_string().contains("results.csv"), "{e}");
        assert!(e.to_string().contains("row 1: 1 fields"), "{e}");
        assert!(!path.exists());

        std::fs::write(&path, "a,b\n1,2\ndgc x1 (budget=elements, clip=3.0),2\n").unwrap();
        let e = read(&path).unwrap_err();
        assert!(e.to_string().contains("results.csv"), "{e}");
        assert!(
            e.to_string()
                .contains("expected CSV with one field per header column"),
            "{e}"
        );
    }
}
