#pragma once
// OpenAI's Responses API (`POST /v1/responses`), the interface OpenAI's own agents (Codex, the
// Agents SDK) speak. The request's input items become chat messages for the same V4 encoding as
// /v1/chat/completions (a conversation sent either way renders the same prompt, so the prefix
// cache serves both); the answer comes back as output items (reasoning, message, function_call)
// in one response object, or as the API's typed stream events (response.created ...
// response.completed). Responses are kept for previous_response_id when the request says `store`
// (response_store.h).
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "server/response.h"
#include "server/response_store.h"

namespace dsv4::server {

// Fills `r` from a /v1/responses body (ApiError on bad input, naming the field).
void parse_openai_responses(const nlohmann::ordered_json& j, ParsedRequest& r, const ModelFacts& model,
                            const RequestLimits& lim, const ToolCallStore* calls, const ResponseStore* kept);

// GET /v1/responses/{id}/input_items: a page of the kept response's input items. `query` holds
// the URL's parameters: limit (1-100, default 20), order (asc, or desc: newest first, the
// default), after (an item id: the page starts after it, in that order), include
// (reasoning.encrypted_content: reasoning items keep that field, which they lose otherwise);
// others are ignored. A bad value is an ApiError (400) naming it.
nlohmann::ordered_json list_input_items(const StoredResponse& s, const std::multimap<std::string, std::string>& query);

// The answer's formatter; keeps the response in `kept` at its end when r.store_response.
std::unique_ptr<Responder> make_responses_responder(const ParsedRequest& r, const Tokenizer& tok, ToolCallStore& calls,
                                                    ResponseStore* kept);

}  // namespace dsv4::server
