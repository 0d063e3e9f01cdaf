//! Overrides of calendar policies: a limit alone keeps the calendar and its zone; `calendar`
//! changes the period; `window` trades the calendar for a fixed window.

use super::*;

fn monthly(limit: u32) -> Quota {
    let calendar =
        Calendar::new(CalendarUnit::Month, "Europe/Lisbon").unwrap_or_else(|e| panic!("{e}"));
    Quota::fixed_calendar(limit, calendar).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_limit_keeps_the_policys_calendar() {
    let fields = QuotaFields {
        limit: Some(50),
        ..QuotaFields::default()
    };
    assert_eq!(fields.apply(&monthly(10)), Ok(monthly(50)));
}

#[test]
fn calendar_changes_the_period_in_the_policys_zone() {
    let fields = QuotaFields {
        calendar: Some(CalendarUnit::Day),
        ..QuotaFields::default()
    };
    let day = fields
        .apply(&monthly(10))
        .map(|q| q.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        day,
        "fixed_window limit=10 calendar=day timezone=Europe/Lisbon"
    );
    // A fixed window by duration takes a calendar in UTC.
    let plain = Quota::fixed_window(10, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    let weekly = QuotaFields {
        calendar: Some(CalendarUnit::Week),
        limit: Some(3),
        ..QuotaFields::default()
    };
    assert_eq!(
        weekly.apply(&plain).map(|q| q.to_string()),
        Ok("fixed_window limit=3 calendar=week timezone=UTC".to_owned())
    );
}

#[test]
fn window_replaces_the_calendar_and_both_are_refused() {
    let hourly = QuotaFields {
        window: Some(Duration::from_secs(3600)),
        ..QuotaFields::default()
    };
    assert_eq!(
        hourly.apply(&monthly(10)),
        Quota::fixed_window(10, Duration::from_secs(3600)).map_err(|_| field_error("x", ""))
    );
    let both = QuotaFields {
        window: Some(Duration::from_secs(3600)),
        calendar: Some(CalendarUnit::Day),
        ..QuotaFields::default()
    };
    assert!(matches!(
        both.apply(&monthly(10)),
        Err(OverrideError::Field {
            field: "calendar",
            ..
        })
    ));
    // Only a fixed window counts by the calendar.
    let sliding = Quota::sliding_window_counter(10, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    let day = QuotaFields {
        calendar: Some(CalendarUnit::Day),
        ..QuotaFields::default()
    };
    assert!(matches!(
        day.apply(&sliding),
        Err(OverrideError::Field {
            field: "calendar",
            ..
        })
    ));
}
