// Implementation of common/message_text.h.
#include "common/message_text.h"

#include "absl/strings/str_cat.h"

namespace orthoserve {

std::string BoundedText(absl::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  size_t cut = max;
  // Back up over UTF-8 continuation bytes (10xxxxxx), so that no character is split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), "...(", text.size(), " bytes)");
}

std::string MatrixLabel(int index, absl::string_view name) {
  return absl::StrCat("matrix ", index, " (\"", BoundedText(name), "\")");
}

}  // namespace orthoserve
