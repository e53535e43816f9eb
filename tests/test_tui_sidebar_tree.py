"""The sessions sidebar as a tree: forks under the session they came from (most recent first at
every level), a filtered list that lost a parent, broken parent links, and the list's selection
and `highlighted_id` in display order."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult
from textual.widgets import OptionList

from velo_chat.app.widgets.sessions.sidebar import (
    MAX_INDENT_LEVELS,
    SessionList,
    SessionSidebar,
    session_tree,
    tree_prefix,
)
from velo_chat.store import Session, SessionStore

from tests.support.store_helpers import tick_clock

NOW = 1_800_000_000.0


def session(sid: str, updated: float, parent: str | None = None, title: str | None = None) -> Session:
    return Session(
        id=sid,
        title=title or sid,
        created_at=updated,
        updated_at=updated,
        profile="default",
        system_prompt="",
        model_fingerprint=None,
        parent_session_id=parent,
    )


def shape(tree: list[tuple[Session, int]]) -> list[tuple[str, int]]:
    return [(s.id, depth) for s, depth in tree]


# A family: "a" with forks "a1" (newer) and "a2" (older); "a1" has its own fork "a1x"; "b" alone,
# more recent than "a" itself but older than a's forks.
FAMILY = [
    session("a1x", 90, parent="a1"),
    session("a1", 80, parent="a"),
    session("b", 70),
    session("a2", 60, parent="a"),
    session("a", 50),
]


def test_forks_follow_their_parent_most_recent_first_at_every_level():
    assert shape(session_tree(FAMILY)) == [
        ("b", 0),
        ("a", 0),
        ("a1", 1),
        ("a1x", 2),
        ("a2", 1),
    ]


def test_the_tree_does_not_depend_on_the_order_it_is_given():
    assert shape(session_tree(reversed(FAMILY))) == shape(session_tree(FAMILY))


def test_a_child_whose_parent_is_filtered_out_shows_at_top_level():
    filtered = [s for s in FAMILY if s.id != "a"]  # e.g. the filter matched only the forks
    assert shape(session_tree(filtered)) == [("a1", 0), ("a1x", 1), ("b", 0), ("a2", 0)]


def test_a_parent_that_was_deleted_leaves_its_fork_at_top_level():
    orphan = session("f", 10, parent="gone")
    assert shape(session_tree([orphan, session("g", 20)])) == [("g", 0), ("f", 0)]


def test_broken_parent_links_never_hide_or_repeat_a_session():
    cycle = [
        session("x", 30, parent="y"),
        session("y", 20, parent="x"),
        session("y1", 10, parent="y"),
        session("self", 40, parent="self"),
    ]
    tree = session_tree(cycle)
    assert sorted(s.id for s, _ in tree) == ["self", "x", "y", "y1"]
    # the cycle is entered at its most recent member, which stands in as a root
    assert shape(tree) == [("self", 0), ("x", 0), ("y", 1), ("y1", 2)]


def test_a_long_chain_of_derived_sessions_does_not_recurse():
    chain = [session("s0", 0)] + [session(f"s{i}", i, parent=f"s{i - 1}") for i in range(1, 5000)]
    tree = session_tree(chain)
    assert [depth for _, depth in tree] == list(range(5000))


def test_indentation_grows_with_depth_up_to_a_limit():
    assert tree_prefix(0) == ""
    assert tree_prefix(1) == "└ "
    assert tree_prefix(2) == "  └ "
    assert tree_prefix(MAX_INDENT_LEVELS + 5) == tree_prefix(MAX_INDENT_LEVELS)


class SidebarHost(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.selected: list[str] = []

    def compose(self) -> ComposeResult:
        yield SessionSidebar(clock=lambda: NOW, cursor_blink=False, id="sidebar")

    def on_session_sidebar_selected(self, event: SessionSidebar.Selected) -> None:
        self.selected.append(event.session_id)


def prompts(lst: OptionList) -> list[str]:
    return [str(lst.get_option_at_index(i).prompt) for i in range(lst.option_count)]


async def test_the_sidebar_lists_forks_indented_under_their_parent():
    app = SidebarHost()
    async with app.run_test(size=(60, 20)) as pilot:
        bar = app.query_one(SessionSidebar)
        bar.show(FAMILY, active_id="a1x")
        await pilot.pause()
        lst = bar.query_one(SessionList)
        assert [s.id for s in bar.sessions] == ["b", "a", "a1", "a1x", "a2"]
        assert [lst.get_option_at_index(i).id for i in range(lst.option_count)] == [
            "b",
            "a",
            "a1",
            "a1x",
            "a2",
        ]
        shown = prompts(lst)
        assert shown[0].startswith("  b ") and shown[1].startswith("  a ")
        assert shown[2].startswith("  └ a1 ") and shown[4].startswith("  └ a2 ")
        assert shown[3].startswith("▶   └ a1x ")  # the active one, two levels down
        # the active session is highlighted at its place in the tree
        assert lst.highlighted == 3 and bar.highlighted_id() == "a1x"


async def test_highlighted_id_and_selection_follow_the_display_order():
    app = SidebarHost()
    async with app.run_test(size=(60, 20)) as pilot:
        bar = app.query_one(SessionSidebar)
        bar.show(FAMILY, active_id=None)
        await pilot.pause()
        lst = bar.query_one(SessionList)
        lst.focus()
        lst.highlighted = 4
        assert bar.highlighted_id() == "a2"
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == ["a2"]
        # a filtered list: the forks without their parent are top-level rows, still selectable
        bar.show([s for s in FAMILY if s.id in {"a1", "a2"}], active_id=None)
        await pilot.pause()
        assert [s.id for s in bar.sessions] == ["a1", "a2"]
        assert not any(p.lstrip().startswith("└") for p in prompts(lst))
        lst.highlighted = 1
        assert bar.highlighted_id() == "a2"


async def test_a_real_store_fork_of_a_fork_shows_two_levels_down(tmp_path: Path):
    with SessionStore(tmp_path / "sessions.sqlite3", clock=tick_clock()) as store:
        root = store.create_session("default", title="root")
        first = store.add_message(root.id, "user", "hello")
        fork = store.fork(root.id, first.id, title="fork")
        fork_msg = store.messages(fork.id)[0]
        fork_of_fork = store.fork(fork.id, fork_msg.id, title="fork of fork")
        other = store.create_session("default", title="other")
        listed = store.list_sessions()
    app = SidebarHost()
    async with app.run_test(size=(60, 20)) as pilot:
        bar = app.query_one(SessionSidebar)
        bar.show(listed, active_id=fork.id)
        await pilot.pause()
        assert [s.id for s in bar.sessions] == [other.id, root.id, fork.id, fork_of_fork.id]
        shown = prompts(bar.query_one(SessionList))
        assert shown[2].startswith("▶ └ fork ") and shown[3].startswith("    └ fork of fork ")
        assert bar.highlighted_id() == fork.id
