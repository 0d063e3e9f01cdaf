//! Calendar windows in the configuration: what is accepted, and each refusal at its position.

use super::*;

fn errors(text: &str) -> Vec<String> {
    match Config::parse("t.toml", text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(d)) => d.0.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    }
}

const HEAD: &str = "[[policy]]\nname = \"monthly\"\n";

#[test]
fn a_calendar_policy_is_a_fixed_window_by_period() {
    let text = format!(
        "{HEAD}algorithm = \"fixed_window\"\nlimit = 10000\ncalendar = \"month\"\ntimezone = \"Europe/Lisbon\"\n"
    );
    let c = Config::parse("t.toml", &text);
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let quota = c.policies[0].policy.quota();
    assert_eq!(
        quota.to_string(),
        "fixed_window limit=10000 calendar=month timezone=Europe/Lisbon"
    );
    // The zone defaults to UTC.
    let text = format!("{HEAD}algorithm = \"fixed_window\"\nlimit = 5\ncalendar = \"week\"\n");
    let c = Config::parse("t.toml", &text).map_err(|e| e.to_string());
    assert_eq!(
        c.map(|c| c.policies[0].policy.quota().to_string()),
        Ok("fixed_window limit=5 calendar=week timezone=UTC".to_owned())
    );
}

#[test]
fn refusals_name_the_field_at_its_line_and_column() {
    let cases = [
        (
            "algorithm = \"fixed_window\"\nlimit = 5\ncalendar = \"day\"\ntimezone = \"Mars/Olympus\"\n",
            "t.toml:6:12",
            "unknown time zone",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 5\ncalendar = \"day\"\nwindow = \"1d\"\n",
            "t.toml:6:10",
            "cannot be used together",
        ),
        (
            "algorithm = \"sliding_window_counter\"\nlimit = 5\ncalendar = \"day\"\n",
            "t.toml:5:12",
            "applies only to algorithm \"fixed_window\"",
        ),
        (
            "limit = 5\ncalendar = \"day\"\n",
            "t.toml:4:12",
            "applies only to algorithm \"fixed_window\", not \"sliding_window_counter\"",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1d\"\ntimezone = \"UTC\"\n",
            "t.toml:6:12",
            "applies only to a calendar window",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 5\ncalendar = \"fortnight\"\n",
            "t.toml:5:12",
            "unknown calendar period",
        ),
        (
            "algorithm = \"fixed_window\"\ncalendar = \"day\"\n",
            "t.toml:1:1",
            "field \"limit\" is required",
        ),
        // A bucket has no limit to ask for: the one error is the calendar on it.
        (
            "algorithm = \"token_bucket\"\ncapacity = 5\nrefill = \"1/s\"\ncalendar = \"day\"\n",
            "t.toml:6:12",
            "applies only to algorithm \"fixed_window\", not \"token_bucket\"",
        ),
    ];
    for (body, at, says) in cases {
        let e = errors(&format!("{HEAD}{body}"));
        assert_eq!(e.len(), 1, "{body}: {e:?}");
        assert!(e[0].starts_with(at), "{body}: {e:?}");
        assert!(e[0].contains(says), "{body}: {e:?}");
    }
}
