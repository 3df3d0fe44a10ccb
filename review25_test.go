package drivesync

import "testing"

// Review 25: writeTogether with nested savepoints, deferred foreign keys,
// updateTrigger, and adoptTable's row-by-row fallback.

// (updateTrigger has since given way to skipsEngineWrites, review 29.)
// updateTrigger reads a trigger's words before the first ON as its
// events, with ddlWords, which splits words at '$'. SQLite takes '$'
// inside a name (update$on is one plain identifier), so a trigger named
// update$on that fires AFTER DELETE reads as [UPDATE] ON ...: an
// UPDATE-only trigger. deletesStayInTable then lets writeTogether delete
// and write again the swapped rows, and the app's delete trigger logs
// deletes of rows that were never deleted (which review 20's
// SwapTogetherOnlyWhereSafe keeps from happening for other names).
//
// Sequence: b has an AFTER DELETE trigger named update$on logging deletes
// of items; a swaps i1 and i2; all sync.
func TestReview25DollarNameReadAsUpdateTrigger(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE TABLE gone (id TEXT);
CREATE TRIGGER update$on AFTER DELETE ON items BEGIN INSERT INTO gone VALUES (OLD.id); END`, "")
	if skipsEngineWrites(`CREATE TRIGGER update$on AFTER DELETE ON items BEGIN INSERT INTO gone VALUES (OLD.id); END`) {
		t.Errorf("an unguarded AFTER DELETE trigger reads as skipping the engine's writes")
	}
	swap(t, a)
	syncAll(t, a, b)
	if got := b.rows(`SELECT id FROM gone ORDER BY id`); got != "" {
		t.Errorf("b's app trigger logged deletes of rows never deleted: %q", got)
	}
}

// A trigger on updates only that does not skip the engine's writes would
// miss a swap written as a delete and an insert: such a table is left
// alone, its swap reported, as before.
func TestReview25UnguardedUpdateTriggerKeepsTableAlone(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE TABLE moves (id TEXT, pos INTEGER);
CREATE TRIGGER items_moved AFTER UPDATE OF pos ON items BEGIN INSERT INTO moves VALUES (NEW.id, NEW.pos); END`, "")
	swap(t, a)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 2 {
		t.Errorf("b: unwritten %v, want the swap reported", ids)
	}
	if got := b.rows(`SELECT count(*) FROM moves`); got != "0\n" {
		t.Errorf("b's moves: %s", got)
	}
}
