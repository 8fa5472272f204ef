package mysql

// Statements and helpers that the external tests examine.
const (
	TimerGetWindowSQL   = timerGetWindow
	TimerDeleteRangeSQL = timerDeleteRange
	LocatedDeleteSQL    = `DELETE FROM timers ` + located
)

var Retry = retry
