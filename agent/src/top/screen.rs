//! `hostprof top`'s screen: what the keys do ([`Screen::on_key`]) and how a
//! [`Table`] is drawn ([`Screen::draw`]), on any ratatui backend (tests draw
//! on a `TestBackend`).
use ratatui::{
    Frame,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Cell, Paragraph, Row as TableRow, Table as TableWidget},
};

use super::{Filter, Query, Sort, Table, Unit, View};

/// The keys, as the bottom line lists them.
pub const HELP: &str = "q quit | s sort self/total | v functions/stacks | t traces | \
     a values of an attribute | / filter: pid:N tid:N comm:X thread:X container:ID|host \
     trace:ID attr:KEY=VALUE | Esc clear";

/// What typed text is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prompt {
    /// `/`: a [`Filter`].
    Filter,
    /// `a`: the attribute whose values to rank.
    Attribute,
}

/// What the screen says about the run, besides the table.
#[derive(Clone, Debug)]
pub struct Header {
    /// `host-wide` or `pid 42, 43`.
    pub targets: String,
    pub frequency_hz: u64,
    pub window_seconds: usize,
    pub unit: Unit,
    /// Samples the kernel or the pipeline dropped so far.
    pub lost: u64,
    /// Set once every `-p` process has exited.
    pub targets_exited: bool,
}

/// What a key asks of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed.
    None,
    /// The query changed: draw again now.
    Redraw,
    Quit,
}

/// The screen's state: the query, and the filter being typed.
#[derive(Debug, Default)]
pub struct Screen {
    pub query: Query,
    /// Text typed after `/` or `a`, until Enter or Esc.
    typing: Option<(Prompt, String)>,
    /// Why the last typed filter was refused.
    error: Option<String>,
}

impl Screen {
    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        // Raw mode turns Ctrl-C into a key: it quits whatever is going on.
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some((prompt, text)) = &mut self.typing {
            match key.code {
                KeyCode::Char(c) => text.push(c),
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Esc => self.typing = None,
                KeyCode::Enter if *prompt == Prompt::Filter => {
                    match Filter::parse(text) {
                        Ok(filter) => {
                            self.query.filter = filter;
                            self.error = None;
                        }
                        Err(err) => self.error = Some(err.to_string()),
                    }
                    self.typing = None;
                }
                KeyCode::Enter => {
                    // Blank text names no attribute: the view stays.
                    let name = text.trim();
                    if !name.is_empty() {
                        self.query.attribute = name.to_owned();
                        self.query.view = View::Values;
                    }
                    self.typing = None;
                }
                _ => return Action::None,
            }
            return Action::Redraw;
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('s') => {
                self.query.sort = match self.query.sort {
                    Sort::SelfShare => Sort::TotalShare,
                    Sort::TotalShare => Sort::SelfShare,
                }
            }
            KeyCode::Char('v') => {
                self.query.view = match self.query.view {
                    View::Functions => View::Stacks,
                    View::Stacks | View::Traces | View::Values => View::Functions,
                }
            }
            KeyCode::Char('t') => {
                self.query.view = match self.query.view {
                    View::Traces => View::Functions,
                    _ => View::Traces,
                }
            }
            KeyCode::Char('a') => {
                self.typing = Some((Prompt::Attribute, self.query.attribute.clone()));
            }
            KeyCode::Char('/') => {
                self.typing = Some((
                    Prompt::Filter,
                    self.query
                        .filter
                        .as_ref()
                        .map(Filter::to_string)
                        .unwrap_or_default(),
                ))
            }
            KeyCode::Esc => {
                self.query.filter = None;
                self.error = None;
            }
            _ => return Action::None,
        }
        Action::Redraw
    }

    /// Draws the header, the table and the key line.
    pub fn draw(&self, frame: &mut Frame, header: &Header, table: &Table) {
        let [top, what, body, bottom] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Fill(1),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        frame.render_widget(Paragraph::new(title(header, table)), top);
        frame.render_widget(Paragraph::new(self.state_line()), what);
        frame.render_widget(self.table(header.unit, table), body);
        let bottom_line = match &self.typing {
            Some((Prompt::Filter, text)) => format!("filter: {text}_   (Enter apply, Esc cancel)"),
            Some((Prompt::Attribute, text)) => format!(
                "rank the values of (service.name, thread.name, …): {text}_   \
                 (Enter apply, Esc cancel)"
            ),
            None => HELP.to_owned(),
        };
        frame.render_widget(
            Paragraph::new(Line::styled(
                bottom_line,
                Style::new().add_modifier(Modifier::REVERSED),
            )),
            bottom,
        );
    }

    /// `functions by self share, filter: pid:42`.
    fn state_line(&self) -> String {
        let mut line = match (self.query.view, self.query.sort) {
            (View::Functions, Sort::SelfShare) => "functions by self share".to_owned(),
            (View::Functions, Sort::TotalShare) => "functions by total share".to_owned(),
            (View::Stacks, _) => "stacks, leaf first".to_owned(),
            (View::Traces, _) => "trace ids, busiest first".to_owned(),
            (View::Values, _) => format!("values of {}, busiest first", self.query.attribute),
        };
        if let Some(filter) = &self.query.filter {
            line.push_str(&format!(", filter: {filter}"));
        }
        if let Some(error) = &self.error {
            line.push_str(&format!("  (not a filter: {error})"));
        }
        line
    }

    fn table<'a>(&self, unit: Unit, table: &'a Table) -> TableWidget<'a> {
        let percent = |weight| format!("{:>6.2}", 100.0 * table.share(weight));
        let amount = |weight| format!("{:>8}", self::weight(unit, weight));
        let bold = Style::new().add_modifier(Modifier::BOLD);
        match self.query.view {
            View::Functions => {
                let rows = table.rows.iter().map(|row| {
                    TableRow::new([
                        Cell::new(percent(row.self_weight)),
                        Cell::new(percent(row.total_weight)),
                        Cell::new(amount(row.self_weight)),
                        Cell::new(amount(row.total_weight)),
                        Cell::new(row.name.as_str()),
                        Cell::new(row.module.as_str()),
                        Cell::new(row.process.as_str()),
                        Cell::new(row.container.as_str()),
                    ])
                });
                TableWidget::new(
                    rows,
                    [
                        Constraint::Length(6),
                        Constraint::Length(6),
                        Constraint::Length(8),
                        Constraint::Length(8),
                        Constraint::Fill(3),
                        Constraint::Max(18),
                        Constraint::Max(22),
                        Constraint::Length(12),
                    ],
                )
                .header(
                    TableRow::new([
                        " %SELF",
                        "%TOTAL",
                        "    SELF",
                        "   TOTAL",
                        "FUNCTION",
                        "MODULE",
                        "PROCESS",
                        "CONTAINER",
                    ])
                    .style(bold),
                )
            }
            View::Stacks => {
                let rows = table.rows.iter().map(|row| {
                    TableRow::new([
                        Cell::new(percent(row.self_weight)),
                        Cell::new(amount(row.self_weight)),
                        Cell::new(row.process.as_str()),
                        Cell::new(row.container.as_str()),
                        Cell::new(row.name.as_str()),
                    ])
                });
                TableWidget::new(
                    rows,
                    [
                        Constraint::Length(6),
                        Constraint::Length(8),
                        Constraint::Max(22),
                        Constraint::Length(12),
                        Constraint::Fill(1),
                    ],
                )
                .header(
                    TableRow::new(["     %", "  WEIGHT", "PROCESS", "CONTAINER", "STACK"])
                        .style(bold),
                )
            }
            View::Traces | View::Values => {
                let rows = table.rows.iter().map(|row| {
                    TableRow::new([
                        Cell::new(percent(row.self_weight)),
                        Cell::new(amount(row.self_weight)),
                        Cell::new(row.name.as_str()),
                        Cell::new(row.module.as_str()),
                        Cell::new(row.process.as_str()),
                        Cell::new(row.container.as_str()),
                    ])
                });
                let (heading, width) = match self.query.view {
                    // A trace id is 32 hex digits, all of which tell it apart.
                    View::Traces => ("TRACE ID", Constraint::Length(32)),
                    _ => ("VALUE", Constraint::Fill(2)),
                };
                TableWidget::new(
                    rows,
                    [
                        Constraint::Length(6),
                        Constraint::Length(8),
                        width,
                        Constraint::Fill(2),
                        Constraint::Max(22),
                        Constraint::Length(12),
                    ],
                )
                .header(
                    TableRow::new([
                        "     %",
                        "  WEIGHT",
                        heading,
                        "HOTTEST FUNCTION",
                        "PROCESS",
                        "CONTAINER",
                    ])
                    .style(bold),
                )
            }
        }
    }
}

/// `hostprof top: pid 42 at 99 Hz, last 10 s: 990 samples in 1 process, 0 lost`.
fn title(header: &Header, table: &Table) -> String {
    let amount = match header.unit {
        Unit::Samples => format!("{} samples", table.window_weight),
        Unit::Nanos { .. } => format!(
            "{} on and off CPU",
            weight(header.unit, table.window_weight)
        ),
    };
    let exited = if header.targets_exited {
        " (exited)"
    } else {
        ""
    };
    format!(
        "hostprof top: {}{exited} at {} Hz, last {} s: {amount}, {} shown in {} processes, {} lost",
        header.targets,
        header.frequency_hz,
        header.window_seconds,
        match header.unit {
            Unit::Samples => table.total_weight.to_string(),
            Unit::Nanos { .. } => weight(header.unit, table.total_weight),
        },
        table.processes,
        header.lost
    )
}

/// A weight as the columns show it: a count, or a time (`1.25s`, `40ms`).
pub fn weight(unit: Unit, weight: u64) -> String {
    match unit {
        Unit::Samples => weight.to_string(),
        Unit::Nanos { .. } => match weight {
            0 => "0".to_owned(),
            ns if ns >= 1_000_000_000 => format!("{:.2}s", ns as f64 / 1e9),
            ns if ns >= 1_000_000 => format!("{}ms", ns / 1_000_000),
            ns => format!("{}us", ns / 1_000),
        },
    }
}
