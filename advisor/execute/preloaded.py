"""Imported last by the fork server (`children.PRELOAD`): what the server imported lives until it
exits, so it is frozen out of the garbage collector, and collections resume (a server forked
from the command imports without them, as the package does: `children._fork_here`).

The server ends by raising SystemExit when its parent closes the pipe, and the parent waits for
it. Unfrozen, the interpreter's exit would run a last collection over torch's hundreds of
thousands of objects. Its children inherit the frozen objects too. A profile of the server's
preload (`$ADVISOR_PROFILE_DIR`) ends here, before its first fork.
"""

import gc

from advisor.execute.profiling import end_of_preload

gc.freeze()
gc.enable()
end_of_preload()
