//! `top`'s figures on hand-made samples with known shares, and its screen on
//! ratatui's test backend: no terminal, no kernel.
use std::sync::Arc;

use ratatui::{
    Terminal,
    backend::TestBackend,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
};

use super::{
    screen::{Action, HELP, Header, Screen},
    *,
};
use crate::model::{Line, Mapping, OffCpu, ProcessInfo, ResourceValue};

fn process(pid: u32, comm: &str, container: Option<&str>) -> Arc<ProcessInfo> {
    Arc::new(ProcessInfo {
        pid,
        comm: comm.into(),
        exe_path: format!("/bin/{comm}").into(),
        container_id: container.map(Arc::from),
        pod_uid: None,
        service: None,
        thread_keys: None,
    })
}

/// A sample of `tid` in `process` with `names` root first, in `app`.
fn sample(process: &Arc<ProcessInfo>, tid: u32, names: &[&str]) -> ResolvedSample {
    let app = Arc::new(Mapping {
        start: 0x1000,
        end: 0x9000,
        file_offset: 0,
        path: format!("/bin/{}", process.comm).into(),
        dev: 1,
        inode: 2,
        build_ids: Default::default(),
    });
    ResolvedSample {
        process: process.clone(),
        tid,
        thread_name: format!("{}-{tid}", process.comm).into(),
        cpu: 0,
        time_unix_nano: 1,
        frames: names
            .iter()
            .rev()
            .map(|name| Frame {
                kind: FrameKind::Native,
                address: 0x1234,
                mapping: Some(app.clone()),
                file_offset: 0x234,
                lines: vec![Line::named((*name).into(), (*name).into())].into(),
            })
            .collect(),
        off_cpu: None,
        trace: None,
        attributes: Vec::new(),
    }
}

/// `app` (pid 10, two threads): hot 6, cold 2, a recursion 2; `db` (pid 20,
/// in container `c0ffee…`): query 10.
fn window() -> Window {
    let app = process(10, "app", None);
    let db = process(20, "db", Some("c0ffee0123456789abcdef"));
    let mut sink = TopSink::new(Unit::Samples);
    sink.push_count(&sample(&app, 10, &["main", "hot"]), 4);
    sink.push_count(&sample(&app, 11, &["main", "hot"]), 2);
    sink.push_count(&sample(&app, 10, &["main", "cold"]), 2);
    sink.push_count(&sample(&app, 10, &["main", "walk", "walk", "walk"]), 2);
    sink.push_count(&sample(&db, 20, &["serve", "query"]), 10);
    let mut window = Window::new(10);
    window.advance(sink.take());
    assert!(sink.take().is_empty(), "take empties the bucket");
    window
}

fn first(table: &Table) -> &Row {
    table.rows.first().expect("a row")
}

#[test]
fn functions_rank_by_self_then_total_share() {
    let window = window();
    let table = window.table(&Query::default());
    assert_eq!(table.total_weight, 20);
    assert_eq!(table.window_weight, 20);
    assert_eq!(table.processes, 2);
    let names: Vec<&str> = table.rows.iter().map(|row| row.name.as_str()).collect();
    // Self first; ties by total, then name.
    assert_eq!(names, ["query", "hot", "cold", "walk", "main", "serve"]);
    let query = first(&table);
    assert_eq!((query.self_weight, query.total_weight), (10, 10));
    assert_eq!(query.process, "db 20");
    assert_eq!(query.container, "c0ffee012345");
    assert_eq!(query.module, "db");
    assert!((table.share(query.self_weight) - 0.5).abs() < 1e-9);
    // Recursion counts once per stack.
    let walk = table.rows.iter().find(|row| row.name == "walk").unwrap();
    assert_eq!((walk.self_weight, walk.total_weight), (2, 2));

    let by_total = window.table(&Query {
        sort: Sort::TotalShare,
        ..Default::default()
    });
    // Total first, then self: query (10, 10) before main (10, 0).
    assert_eq!(by_total.rows[0].name, "query");
    assert_eq!(by_total.rows[1].name, "main");
    assert_eq!(
        (by_total.rows[1].total_weight, by_total.rows[1].self_weight),
        (10, 0)
    );
}

#[test]
fn stacks_merge_the_threads_of_a_process_leaf_first() {
    let table = window().table(&Query {
        view: View::Stacks,
        ..Default::default()
    });
    let rows: Vec<(&str, u64, &str)> = table
        .rows
        .iter()
        .map(|row| (row.name.as_str(), row.self_weight, row.process.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("query < serve", 10, "db 20"),
            ("hot < main", 6, "app 10"),
            ("cold < main", 2, "app 10"),
            ("walk < walk < walk < main", 2, "app 10"),
        ]
    );
}

#[test]
fn filters_keep_a_process_thread_or_container() {
    let window = window();
    let with = |text: &str| {
        window.table(&Query {
            filter: Filter::parse(text).unwrap(),
            ..Default::default()
        })
    };
    let app = with("pid:10");
    assert_eq!((app.total_weight, app.window_weight), (10, 20));
    assert_eq!(first(&app).name, "hot");
    assert!((app.share(first(&app).self_weight) - 0.6).abs() < 1e-9);
    assert_eq!(with("tid:11").total_weight, 2);
    assert_eq!(with("11").total_weight, 2);
    assert_eq!(with("20").total_weight, 10);
    assert_eq!(with("comm:APP").total_weight, 10);
    assert_eq!(with("thread:app-11").total_weight, 2);
    assert_eq!(with("container:C0FFEE").total_weight, 10);
    assert_eq!(with("container:host").total_weight, 10);
    assert_eq!(first(&with("container:host")).container, "-");
    assert_eq!(with("c0ff").total_weight, 10);
    assert_eq!(with("db").total_weight, 10);
    assert_eq!(with("nothing").total_weight, 0);
    assert!(with("nothing").rows.is_empty());
    assert_eq!(with("   ").total_weight, 20);
    assert!(Filter::parse("pid:x").is_err());
    assert!(Filter::parse("comm:").is_err());
    // Rust and C++ names hold colons: bare text.
    assert_eq!(
        Filter::parse("std::io").unwrap(),
        Some(Filter::Any("std::io".into()))
    );
    let process = Filter::parse("comm:App").unwrap().unwrap();
    assert_eq!(Filter::parse(&process.to_string()).unwrap(), Some(process));
}

#[test]
fn the_window_forgets_old_seconds() {
    let app = process(10, "app", None);
    let mut window = Window::new(2);
    let mut sink = TopSink::new(Unit::Samples);
    for (second, leaf) in ["one", "two", "three"].into_iter().enumerate() {
        sink.push_count(&sample(&app, 10, &["main", leaf]), second as u64 + 1);
        window.advance(sink.take());
    }
    let table = window.table(&Query::default());
    let names: Vec<&str> = table.rows.iter().map(|row| row.name.as_str()).collect();
    assert_eq!(names, ["three", "two", "main"]);
    assert_eq!(table.total_weight, 5);
}

#[test]
fn off_cpu_time_weighs_in_nanoseconds() {
    let app = process(10, "app", None);
    let mut blocked = sample(&app, 10, &["main", "read"]);
    blocked.off_cpu = Some(OffCpu {
        blocked_ns: 30_000_000,
        state: ThreadState::Interruptible,
    });
    let cpu = sample(&app, 10, &["main", "hot"]);
    let mut counts = TopSink::new(Unit::Samples);
    counts.push(&blocked);
    counts.push(&cpu);
    let bucket = counts.take();
    assert_eq!(
        bucket.values().sum::<u64>(),
        1,
        "off-CPU left out of counts"
    );
    let mut times = TopSink::new(Unit::Nanos {
        cpu_period_ns: 10_000_000,
    });
    times.push_count(&blocked, 1);
    times.push_count(&cpu, 2);
    let mut window = Window::new(1);
    window.advance(times.take());
    let table = window.table(&Query::default());
    assert_eq!(table.total_weight, 50_000_000);
    let read = first(&table);
    assert_eq!((read.name.as_str(), read.self_weight), ("read", 30_000_000));
    let state = table
        .rows
        .iter()
        .find(|row| row.name == "[off-cpu: interruptible]")
        .unwrap();
    assert_eq!(state.total_weight, 30_000_000);
    assert_eq!(
        screen::weight(Unit::Nanos { cpu_period_ns: 1 }, 30_000_000),
        "30ms"
    );
    assert_eq!(
        screen::weight(Unit::Nanos { cpu_period_ns: 1 }, 1_500_000_000),
        "1.50s"
    );
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn typed(screen: &mut Screen, text: &str) {
    assert_eq!(screen.on_key(key(KeyCode::Char('/'))), Action::Redraw);
    for c in text.chars() {
        screen.on_key(key(KeyCode::Char(c)));
    }
    assert_eq!(screen.on_key(key(KeyCode::Enter)), Action::Redraw);
}

#[test]
fn keys_sort_switch_filter_and_quit() {
    let mut screen = Screen::default();
    assert_eq!(screen.on_key(key(KeyCode::Char('s'))), Action::Redraw);
    assert_eq!(screen.query.sort, Sort::TotalShare);
    screen.on_key(key(KeyCode::Char('v')));
    assert_eq!(screen.query.view, View::Stacks);
    typed(&mut screen, "pid:42");
    assert_eq!(screen.query.filter, Some(Filter::Pid(42)));
    // While typing, `q` is text, not quit.
    screen.on_key(key(KeyCode::Char('/')));
    assert_eq!(screen.on_key(key(KeyCode::Char('q'))), Action::Redraw);
    assert_eq!(screen.on_key(key(KeyCode::Esc)), Action::Redraw);
    assert_eq!(screen.query.filter, Some(Filter::Pid(42)), "Esc cancels");
    // The typed text starts from the current filter; a bad one keeps it.
    typed(&mut screen, "x");
    assert_eq!(screen.query.filter, Some(Filter::Pid(42)));
    screen.on_key(key(KeyCode::Esc));
    assert_eq!(screen.query.filter, None, "Esc clears");
    typed(&mut screen, "tid:nope");
    assert_eq!(screen.query.filter, None);
    assert_eq!(screen.on_key(key(KeyCode::Char('x'))), Action::None);
    assert_eq!(screen.on_key(key(KeyCode::Char('q'))), Action::Quit);
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    screen.on_key(key(KeyCode::Char('/')));
    assert_eq!(screen.on_key(ctrl_c), Action::Quit);
}

fn drawn(screen: &Screen, table: &Table) -> Vec<String> {
    let header = Header {
        targets: "pid 10".into(),
        frequency_hz: 99,
        window_seconds: 10,
        unit: Unit::Samples,
        lost: 3,
        targets_exited: false,
    };
    let mut terminal = Terminal::new(TestBackend::new(200, 12)).unwrap();
    terminal
        .draw(|frame| screen.draw(frame, &header, table))
        .unwrap();
    let buffer = terminal.backend().buffer();
    (0..buffer.area.height)
        .map(|y| {
            (0..buffer.area.width)
                .map(|x| buffer[(x, y)].symbol())
                .collect::<String>()
                .trim_end()
                .to_owned()
        })
        .collect()
}

#[test]
fn the_screen_shows_the_ranking_and_the_keys() {
    let window = window();
    let mut screen = Screen::default();
    let lines = drawn(&screen, &window.table(&screen.query));
    assert_eq!(
        lines[0],
        "hostprof top: pid 10 at 99 Hz, last 10 s: 20 samples, 20 shown in 2 processes, 3 lost"
    );
    assert_eq!(lines[1], "functions by self share");
    let words = |line: &str| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        words(&lines[2]),
        [
            "%SELF",
            "%TOTAL",
            "SELF",
            "TOTAL",
            "FUNCTION",
            "MODULE",
            "PROCESS",
            "CONTAINER"
        ]
    );
    assert_eq!(
        words(&lines[3]),
        [
            "50.00",
            "50.00",
            "10",
            "10",
            "query",
            "db",
            "db",
            "20",
            "c0ffee012345"
        ]
    );
    assert_eq!(lines[11], HELP);
    typed(&mut screen, "comm:app");
    screen.on_key(key(KeyCode::Char('v')));
    let lines = drawn(&screen, &window.table(&screen.query));
    assert_eq!(lines[1], "stacks, leaf first, filter: comm:app");
    assert_eq!(
        words(&lines[3]),
        ["60.00", "6", "app", "10", "-", "hot", "<", "main"]
    );
    screen.on_key(key(KeyCode::Char('/')));
    assert!(drawn(&screen, &window.table(&screen.query))[11].starts_with("filter: comm:app_"));
}

/// `checkout` (pid 30, service `checkout`): trace A in `encode` 5 and
/// `parse` 1, trace B in `query` 3, no trace in `idle` 2; `cart` (pid 40,
/// service `cart`): trace B in `render` 4.
fn traced_window() -> Window {
    let service = |name: &str| {
        Some(Arc::new(crate::model::ServiceResource::new([
            ("service.name".to_owned(), ResourceValue::Str(name.into())),
            ("service.version".to_owned(), ResourceValue::Int(7)),
        ])))
    };
    let mut checkout = (*process(30, "checkout", None)).clone();
    checkout.service = service("checkout");
    let mut cart = (*process(40, "cart", Some("cafe0123456789"))).clone();
    cart.service = service("cart");
    let (checkout, cart) = (Arc::new(checkout), Arc::new(cart));
    let traced = |process, tid, names: &[&str], trace: Option<u8>| {
        let mut sample = sample(process, tid, names);
        sample.trace = trace.map(|byte| crate::model::TraceLink {
            trace_id: [byte; 16],
            span_id: [tid as u8; 8],
        });
        sample
    };
    let mut sink = TopSink::new(Unit::Samples);
    sink.push_count(&traced(&checkout, 30, &["main", "encode"], Some(0xaa)), 5);
    sink.push_count(&traced(&checkout, 31, &["main", "parse"], Some(0xaa)), 1);
    sink.push_count(&traced(&checkout, 31, &["main", "query"], Some(0xbb)), 3);
    sink.push_count(&traced(&checkout, 30, &["main", "idle"], None), 2);
    sink.push_count(&traced(&cart, 40, &["main", "render"], Some(0xbb)), 4);
    let mut window = Window::new(10);
    window.advance(sink.take());
    window
}

fn rows(table: &Table) -> Vec<(String, u64, String, String)> {
    table
        .rows
        .iter()
        .map(|row| {
            let row = row.clone();
            (row.name, row.self_weight, row.module, row.process)
        })
        .collect()
}

#[test]
fn traces_and_attribute_values_rank_by_weight() {
    let window = traced_window();
    let (a, b) = ("aa".repeat(16), "bb".repeat(16));
    let traces = window.table(&Query {
        view: View::Traces,
        ..Default::default()
    });
    assert_eq!(traces.total_weight, 15);
    assert_eq!(
        rows(&traces),
        [
            (b.clone(), 7, "render (cart)".into(), "cart 40 +1".into()),
            (
                a.clone(),
                6,
                "encode (checkout)".into(),
                "checkout 30".into()
            ),
            (
                NO_VALUE.into(),
                2,
                "idle (checkout)".into(),
                "checkout 30".into()
            ),
        ]
    );
    let values = |attribute: &str, filter: &str| {
        window.table(&Query {
            view: View::Values,
            attribute: attribute.into(),
            filter: Filter::parse(filter).unwrap(),
            ..Default::default()
        })
    };
    let services = values("service.name", "");
    assert_eq!(
        rows(&services)
            .iter()
            .map(|row| (row.0.as_str(), row.1))
            .collect::<Vec<_>>(),
        [("checkout", 11), ("cart", 4)]
    );
    assert_eq!(rows(&values("service.version", ""))[0].0, "7");
    let threads = values("thread.id", "attr:service.name=checkout");
    assert_eq!(
        rows(&threads)
            .iter()
            .map(|row| (row.0.as_str(), row.1))
            .collect::<Vec<_>>(),
        [("30", 7), ("31", 4)]
    );
    // A trace, then its functions: the way from a busy trace to its code.
    let trace_b = window.table(&Query {
        filter: Filter::parse(&format!("trace:{}", &b[..6])).unwrap(),
        ..Default::default()
    });
    assert_eq!(trace_b.total_weight, 7);
    assert_eq!(first(&trace_b).name, "render");
    assert_eq!(values("", "trace:AA").total_weight, 6);
    assert_eq!(values("", "attr:service.name=nope").total_weight, 0);
    assert!(Filter::parse("trace:xyz").is_err());
    assert!(Filter::parse("attr:novalue").is_err());
    for text in ["trace:ab12", "attr:service.name=cart"] {
        let filter = Filter::parse(text).unwrap().unwrap();
        assert_eq!(filter.to_string(), text);
    }
}

#[test]
fn keys_show_traces_and_the_values_of_a_typed_attribute() {
    let window = traced_window();
    let mut screen = Screen::default();
    assert_eq!(screen.on_key(key(KeyCode::Char('t'))), Action::Redraw);
    assert_eq!(screen.query.view, View::Traces);
    let lines = drawn(&screen, &window.table(&screen.query));
    assert_eq!(lines[1], "trace ids, busiest first");
    let words: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        words,
        [
            "%",
            "WEIGHT",
            "TRACE",
            "ID",
            "HOTTEST",
            "FUNCTION",
            "PROCESS",
            "CONTAINER"
        ]
    );
    let first_row: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(
        first_row,
        [
            "46.67",
            "7",
            &"bb".repeat(16),
            "render",
            "(cart)",
            "cart",
            "40",
            "+1",
            "cafe01234567"
        ]
    );
    screen.on_key(key(KeyCode::Char('t')));
    assert_eq!(screen.query.view, View::Functions, "t again: functions");
    // `a`, a key, Enter: its values.
    screen.on_key(key(KeyCode::Char('a')));
    for c in "service.name".chars() {
        screen.on_key(key(KeyCode::Char(c)));
    }
    assert!(drawn(&screen, &window.table(&screen.query))[11].contains("service.name_"));
    screen.on_key(key(KeyCode::Enter));
    assert_eq!(screen.query.view, View::Values);
    let lines = drawn(&screen, &window.table(&screen.query));
    assert_eq!(lines[1], "values of service.name, busiest first");
    assert!(lines[2].contains("VALUE"), "{}", lines[2]);
    assert!(lines[3].contains("checkout"), "{}", lines[3]);
    // Blank text keeps the view; `v` goes back to functions.
    screen.on_key(key(KeyCode::Char('a')));
    for _ in 0.."service.name".len() {
        screen.on_key(key(KeyCode::Backspace));
    }
    screen.on_key(key(KeyCode::Enter));
    assert_eq!(
        (screen.query.view, screen.query.attribute.as_str()),
        (View::Values, "service.name")
    );
    screen.on_key(key(KeyCode::Char('v')));
    assert_eq!(screen.query.view, View::Functions);
}
