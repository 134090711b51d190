#pragma once
// A sequence's host state as bytes, for snapshots kept on disk (the server's prefix cache
// survives a restart). The layout is the in-memory one of kv/state.h, written field by field in
// this machine's byte order: a file is for this build on this machine (engine/engine.h
// Engine::save_snapshot binds it to both).
#include <cstdint>
#include <string>
#include <vector>

#include "kv/state.h"

namespace dsv4 {

// Appends the state's positions and every layer's ring, entry and key rows (only the rows in
// use) and compressor rows to `out`.
void write_state(const SequenceState& st, std::vector<uint8_t>& out);

// Reads what write_state wrote into `st`, a fresh state of the same model
// (make_sequence_state), from `in` at `at` (advanced past it). Throws dsv4::Error naming
// `what` and the field when the bytes end early or do not fit the model's shapes.
void read_state(const std::vector<uint8_t>& in, size_t& at, SequenceState& st, const std::string& what);

}  // namespace dsv4
