//! The library's API as a user of Opacus would meet it (issue 36): a `Trainer` given only a
//! target ε calibrates σ itself, says it through the run's settings, and ends at the target.

mod common;

use dpcomp::config::{Task, TrainConfig};
use dpcomp::privacy::calibrate::noise_multiplier_for;
use dpcomp::train::Trainer;

#[test]
fn the_trainer_with_only_a_target_epsilon_calibrates_sigma_and_ends_at_the_target() {
    let _serial = common::serial();
    let Some(root) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let mut config = TrainConfig::paper_defaults(Task::Surnames);
    config.epochs = 2;
    config.data.limit_train = Some(512);
    config.data.limit_test = Some(128);
    config.data.data_dir = Some(root);
    config.device = dpcomp::config::DeviceChoice::Cpu;
    config.privacy.target_epsilon = Some(3.0);
    assert_eq!(config.privacy.noise_multiplier, None);
    let mut trainer = Trainer::new(config.clone(), &work.path().join("run")).unwrap();
    trainer.progress = false;
    // 512 examples in batches of 32: 16 steps an epoch at q 1/16, 32 steps in all.
    assert_eq!(trainer.steps_per_epoch(), 16);
    let want = noise_multiplier_for(
        config.privacy.accountant,
        3.0,
        1.0 / 16.0,
        32,
        config.privacy.delta,
    )
    .unwrap();
    assert_eq!(trainer.config.privacy.noise_multiplier, Some(want));
    let summary = trainer.run().unwrap();
    let epsilon = summary.epsilon.unwrap();
    assert!(epsilon <= 3.0 && epsilon > 0.999 * 3.0, "epsilon {epsilon}");
    assert_eq!(summary.noise_multiplier, Some(want));
    // The run's config.toml holds the σ it chose, so a resume reads it back.
    let saved = TrainConfig::from_toml_file(&work.path().join("run").join("config.toml")).unwrap();
    assert_eq!(saved.privacy.noise_multiplier, Some(want));
    assert_eq!(saved.privacy.target_epsilon, Some(3.0));
}
