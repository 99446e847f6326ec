//! What the experiment runners' `results.md` tables share: the mean ± sample standard
//! deviation over seeds, and the Markdown table itself (`| a | b |`, a `|---|` rule, one line
//! per row; cells are written as given, without escaping).

/// Mean and, for two or more values, the sample standard deviation.
pub fn mean_sd(values: &[f64]) -> (f64, Option<f64>) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, None);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some(var.sqrt()))
}

/// A Markdown table: a header and rows of cells.
pub(crate) struct MarkdownTable {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl MarkdownTable {
    /// A table with these column names and no rows.
    pub(crate) fn new(header: &[&str]) -> Self {
        MarkdownTable {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (a cell per column; an empty cell is written as `|  |`).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// `| a | b |\n|---|---|\n` and then `| x | y |\n` for each row.
    pub(crate) fn render(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut md = line(&self.header);
        md.push_str(&format!("|{}\n", "---|".repeat(self.header.len())));
        for row in &self.rows {
            md.push_str(&line(row));
        }
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_a_header_a_rule_and_a_line_per_row() {
        let mut table = MarkdownTable::new(&["a", "b"]);
        table.row(vec!["1".to_string(), String::new()]);
        assert_eq!(table.render(), "| a | b |\n|---|---|\n| 1 |  |\n");
    }
}
