// Text from etcd (names, owner ids, a bad entry's fields quoted in a reason)
// as `corma ls` prints it: anyone who can write to etcd chooses these bytes,
// so none of them may forge a line or a column, or steer a terminal.
#pragma once

#include <string>
#include <string_view>

namespace corma::cli {

/// `text` with every byte that is not printable written as \xHH: control
/// bytes (a tab or newline would forge a column or a line, ESC a terminal
/// sequence), DEL, bytes that are not well-formed UTF-8, and the C1
/// controls U+0080..U+009F. A backslash is written \\, so the escaping
/// cannot be forged either. Well-formed UTF-8 text passes unchanged.
[[nodiscard]] std::string escaped_for_listing(std::string_view text);

}  // namespace corma::cli
