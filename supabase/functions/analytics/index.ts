// Supabase Edge Function `analytics`: forwards to the Python function (see ../_shared/sftq_proxy.ts).
import { serve } from "../_shared/sftq_proxy.ts";

serve("analytics");
